package engine

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
)

// Shipping an image build with a moved session. A session's system disk
// is an overlay on its image's read-only layers, so the target needs the
// very build it was made on, byte for byte and by its digest: a rebuild
// would be another build. The build's directory (manifest, kernel,
// initramfs, layers) goes as a bundle of its own, framed and hashed as a
// session's is (move.go), with the magic "BERTHIMG" and a header naming
// the build; the target stages it beside the image's builds and renames
// it into place once whole, where resolveImage finds it by its digest.

const imageMagic = "BERTHIMG"

type imageHeader struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// SendSessionImage writes the image build the session's disks were made
// on.
func (m *Manager) SendSessionImage(ctx context.Context, name string, w io.Writer) error {
	s, err := m.get(name)
	if err != nil {
		return unknownSession(name, err)
	}
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if rec.ImageDigest == "" {
		return &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("session %q was made before image builds were pinned: there is no build to send", name),
			Hint: "build the image on the target, or replace the session's VM first"}
	}
	im, err := m.resolveImage(ctx, rec.Image, rec.ImageDigest)
	if err != nil {
		return err
	}
	dir := filepath.Dir(im.Kernel)
	bw := &bundleWriter{w: bufio.NewWriterSize(w, 2*bundleChunk), sum: sha256.New()}
	bw.raw([]byte(imageMagic))
	bw.raw(binary.BigEndian.AppendUint16(nil, bundleVersion))
	b, _ := json.Marshal(imageHeader{Name: rec.Image, Digest: rec.ImageDigest})
	bw.frame(bframeHeader, b)
	buf := make([]byte, bundleChunk)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		// Layers and blobs are hard links into the caches: regular files
		// here, sent as such. Symlinks are not sent.
		if rel == "." || !d.Type().IsRegular() {
			return nil
		}
		return bw.file(path, rel, buf)
	})
	if err != nil {
		return fmt.Errorf("send image %s@%s: %w", rec.Image, rec.ImageDigest, err)
	}
	bw.end()
	if bw.err != nil {
		return fmt.Errorf("send image %s@%s: %w", rec.Image, rec.ImageDigest, bw.err)
	}
	return nil
}

// ReceiveImage stores an image build a peer sent.
func (m *Manager) ReceiveImage(ctx context.Context, r io.Reader) (err error) {
	if m.cfg.Images == nil {
		return fmt.Errorf("no image store configured: %w", session.ErrUnavailable)
	}
	br := &bundleReader{r: bufio.NewReaderSize(r, 2*bundleChunk), sum: sha256.New()}
	head, err := br.full(len(imageMagic)+2, true)
	if err != nil {
		return err
	}
	if string(head[:len(imageMagic)]) != imageMagic || binary.BigEndian.Uint16(head[len(imageMagic):]) != bundleVersion {
		return errBundle("not an image bundle this berth reads")
	}
	kind, p, err := br.next()
	if err != nil {
		return err
	}
	var hdr imageHeader
	if kind != bframeHeader || json.Unmarshal(p, &hdr) != nil {
		return errBundle("no header")
	}
	if err := image.ValidateName(hdr.Name); err != nil {
		return &session.Error{Class: session.ErrInvalid, Field: session.FieldImage, Msg: err.Error()}
	}
	if hdr.Digest == "" || len(hdr.Digest) > 128 || strings.ContainsAny(hdr.Digest, `/.\`) {
		return errBundle("image digest %q", hdr.Digest)
	}
	imagesDir := m.cfg.Images.Dir
	if _, err := image.LoadDigest(imagesDir, hdr.Name, hdr.Digest); err == nil {
		return &session.Error{Class: session.ErrExists, Msg: fmt.Sprintf("image build %s@%s is here already", hdr.Name, hdr.Digest)}
	}
	parent := filepath.Join(imagesDir, hdr.Name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	partial, err := os.MkdirTemp(parent, "."+hdr.Digest+".partial-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(partial)
		}
	}()
	var st session.MoveStaged
	if err := receiveFiles(ctx, br, partial, nil, &st); err != nil {
		return fmt.Errorf("receive image %s@%s: %w", hdr.Name, hdr.Digest, err)
	}
	if err := syncDir(partial); err != nil {
		return err
	}
	dst := filepath.Join(parent, hdr.Digest)
	if err := os.Rename(partial, dst); err != nil {
		return fmt.Errorf("receive image %s@%s: %w", hdr.Name, hdr.Digest, err)
	}
	syncDir(parent)
	if _, err := image.LoadDigest(imagesDir, hdr.Name, hdr.Digest); err != nil {
		os.RemoveAll(dst)
		return errBundle("the image build received is not whole: %v", err)
	}
	m.log.Info("received an image build", "image", hdr.Name, "digest", hdr.Digest, "files", st.Files, "bytes", st.Bytes)
	return nil
}

// removePartialImages, at start, removes image bundles a crash cut short.
func (m *Manager) removePartialImages() {
	if m.cfg.Images == nil {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(m.cfg.Images.Dir, "*", ".*.partial-*"))
	for _, d := range dirs {
		m.log.Info("removing an interrupted image receive", "dir", d)
		os.RemoveAll(d)
	}
}
