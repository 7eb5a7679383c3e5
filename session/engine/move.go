package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
	"github.com/berthvm/berth/store"
)

// Moving sessions between hosts (session.Mover). The bundle a source
// sends is a stream of frames, each checked by its own SHA-256 and the
// whole by a last one:
//
//	magic "BERTHMOV" · version u16
//	frames: kind u8 · length u32 · payload
//	  'h' header, JSON (bundleHeader)
//	  'f' a file of the session's directory, JSON (bundleFile)
//	  'd' data of the last file: offset u64 · sha256 (32) · bytes
//	  'r' a piece of the store's export of the session: sha256 · bytes
//	  'e' end: the SHA-256 of every byte before this frame but the data
//	      of 'd' and 'r' frames, which their own hashes stand for
//
// Files go sparse: only their data extents (SEEK_DATA/SEEK_HOLE), so a
// 10 GiB workspace with 100 MiB written sends 100 MiB. The target stages
// the bundle under <data>/moves/.<name>.partial, renamed to
// <data>/moves/<name> once whole and verified; CommitReceived renames the
// session's directory into sessions/ and imports its records. A partial
// staging is removed at start; a whole one is kept, since the fleet may
// have committed the move already and CommitReceived must then still
// succeed after a restart.

const (
	bundleMagic   = "BERTHMOV"
	bundleVersion = 1

	bframeHeader  = 'h'
	bframeFile    = 'f'
	bframeData    = 'd'
	bframeRecords = 'r'
	bframeEnd     = 'e'

	// bundleChunk is the most data one frame carries; bundleFrameMax
	// bounds what a receiver reads as one frame.
	bundleChunk    = 1 << 20
	bundleFrameMax = bundleChunk + 64<<10
	// maxBundleFiles, maxBundleFileSize and maxBundleRecords bound what a
	// peer may make a receiver store.
	maxBundleFiles    = 100_000
	maxBundleFileSize = 16 << 40
	maxBundleRecords  = 8 << 30

	movesDir       = "moves"
	stagedSession  = "session"
	stagedRecords  = "records"
	stagedMetaFile = "staged.json"
)

// bundleHeader opens a bundle.
type bundleHeader struct {
	Name        string        `json:"name"`
	State       session.State `json:"state"`
	Image       string        `json:"image,omitempty"`
	ImageDigest string        `json:"image_digest,omitempty"`
	VMM         string        `json:"vmm,omitempty"`
	// Checkpoint makes the bundle a replica of that checkpoint (files
	// under checkpoints/<id>/ only), for ReceiveReplica; a move's has
	// none.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// bundleFile announces one file, relative to the session's directory.
type bundleFile struct {
	Path string      `json:"path"`
	Size int64       `json:"size"`
	Mode fs.FileMode `json:"mode"`
}

var _ session.Mover = (*Manager)(nil)

func (m *Manager) movesDir() string { return filepath.Join(m.cfg.DataDir, movesDir) }

func (m *Manager) stagedDir(name string) string { return filepath.Join(m.movesDir(), name) }

// removePartialMoves, at start, removes bundles a crash cut short.
func (m *Manager) removePartialMoves() {
	dirs, _ := filepath.Glob(filepath.Join(m.movesDir(), ".*"))
	for _, d := range dirs {
		m.log.Info("removing an interrupted move's staging", "dir", d)
		os.RemoveAll(d)
	}
}

// SendSession writes the bundle of a stopped or sleeping session to w.
func (m *Manager) SendSession(ctx context.Context, name string, w io.Writer) error {
	s, err := m.get(name)
	if err != nil {
		return unknownSession(name, err)
	}
	s.op.Lock()
	defer s.op.Unlock()
	if err := s.checkMove(); err != nil {
		return err
	}
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	hdr := bundleHeader{Name: name, State: session.State(rec.State), Image: rec.Image, ImageDigest: rec.ImageDigest, VMM: rec.VMM}
	bw := &bundleWriter{w: bufio.NewWriterSize(w, 2*bundleChunk), sum: sha256.New()}
	bw.raw([]byte(bundleMagic))
	bw.raw(binary.BigEndian.AppendUint16(nil, bundleVersion))
	b, _ := json.Marshal(hdr)
	bw.frame(bframeHeader, b)
	buf := make([]byte, bundleChunk)
	err = filepath.WalkDir(s.dir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.dir(), path)
		if rel == "." {
			return nil
		}
		// vm/ is the stopped VMM's sockets, pid and logs: nothing a new
		// VM on the target uses. Dot-entries are work a crash left.
		if d.IsDir() && (rel == "vm" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		return bw.file(path, rel, buf)
	})
	if err != nil {
		return fmt.Errorf("send session %q: %w", name, err)
	}
	rw := &recordsWriter{bw: bw}
	if err := m.st.ExportSession(name, rw); err != nil {
		return fmt.Errorf("send session %q: %w", name, err)
	}
	if err := rw.flush(); err != nil {
		return fmt.Errorf("send session %q: %w", name, err)
	}
	bw.end()
	if bw.err != nil {
		return fmt.Errorf("send session %q: %w", name, bw.err)
	}
	s.sent.Store(s.changes.Load() + 1)
	return nil
}

// checkMove refuses to move a session that has a VM.
func (s *sess) checkMove() error {
	st := s.state()
	if st == session.StateRunning || st == session.StatePaused {
		return &session.Error{Class: session.ErrInvalidState, Msg: fmt.Sprintf("cannot move session %q: it is %s", s.name, st),
			Hint: "stop it, or put it to sleep to keep its processes, then move it"}
	}
	return s.check(session.ActionMove)
}

// bundleWriter writes frames, hashing all of them but the end; it keeps
// the first error.
type bundleWriter struct {
	w   *bufio.Writer
	sum hash.Hash
	err error
}

func (bw *bundleWriter) raw(b []byte) {
	if bw.err != nil {
		return
	}
	bw.sum.Write(b)
	_, bw.err = bw.w.Write(b)
}

func (bw *bundleWriter) frame(kind byte, parts ...[]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	bw.raw(h[:])
	for _, p := range parts {
		bw.raw(p)
	}
}

// chunk frames data with its own hash after the prefix pre. The
// bundle's hash covers the chunk's hash, not its data again: one pass of
// SHA-256 over the data, not two.
func (bw *bundleWriter) chunk(kind byte, pre, data []byte) {
	sum := sha256.Sum256(data)
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(pre)+len(sum)+len(data)))
	bw.raw(h[:])
	bw.raw(pre)
	bw.raw(sum[:])
	if bw.err == nil {
		_, bw.err = bw.w.Write(data)
	}
}

func (bw *bundleWriter) end() {
	if bw.err != nil {
		return
	}
	sum := bw.sum.Sum(nil)
	var h [5]byte
	h[0] = bframeEnd
	binary.BigEndian.PutUint32(h[1:], uint32(len(sum)))
	if _, bw.err = bw.w.Write(h[:]); bw.err == nil {
		if _, bw.err = bw.w.Write(sum); bw.err == nil {
			bw.err = bw.w.Flush()
		}
	}
}

// file sends one file: its header, then its data extents.
func (bw *bundleWriter) file(path, rel string, buf []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	b, _ := json.Marshal(bundleFile{Path: filepath.ToSlash(rel), Size: fi.Size(), Mode: fi.Mode().Perm()})
	bw.frame(bframeFile, b)
	return diskcopy.DataExtents(f, fi.Size(), func(off, n int64) error {
		for n > 0 {
			c := min(n, int64(len(buf)))
			if _, err := f.ReadAt(buf[:c], off); err != nil {
				return err
			}
			bw.chunk(bframeData, binary.BigEndian.AppendUint64(nil, uint64(off)), buf[:c])
			if bw.err != nil {
				return bw.err
			}
			off, n = off+c, n-c
		}
		return nil
	})
}

// recordsWriter frames the store's export in pieces of bundleChunk.
type recordsWriter struct {
	bw  *bundleWriter
	buf []byte
}

func (rw *recordsWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		c := min(len(p), bundleChunk-len(rw.buf))
		rw.buf = append(rw.buf, p[:c]...)
		p = p[c:]
		if len(rw.buf) == bundleChunk {
			if err := rw.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (rw *recordsWriter) flush() error {
	if len(rw.buf) > 0 {
		rw.bw.chunk(bframeRecords, nil, rw.buf)
		rw.buf = rw.buf[:0]
	}
	return rw.bw.err
}

// errBundle classes a bundle that is malformed, truncated or fails a hash.
func errBundle(format string, args ...any) error {
	return &session.Error{Class: session.ErrInvalid, Msg: "move bundle: " + fmt.Sprintf(format, args...),
		Hint: "the sender's stream was damaged or cut: move it again"}
}

// bundleReader reads frames, hashing what it reads.
type bundleReader struct {
	r   *bufio.Reader
	sum hash.Hash
	buf []byte
}

func (br *bundleReader) full(n int, hashed bool) ([]byte, error) {
	if cap(br.buf) < n {
		br.buf = make([]byte, n)
	}
	b := br.buf[:n]
	if _, err := io.ReadFull(br.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, errBundle("truncated")
		}
		return nil, err
	}
	if hashed {
		br.sum.Write(b)
	}
	return b, nil
}

func (br *bundleReader) next() (byte, []byte, error) {
	h, err := br.full(5, false)
	if err != nil {
		return 0, nil, err
	}
	kind, n := h[0], binary.BigEndian.Uint32(h[1:])
	if n > bundleFrameMax {
		return 0, nil, errBundle("a frame of %d bytes", n)
	}
	if kind == bframeEnd {
		p, err := br.full(int(n), false)
		return kind, p, err
	}
	br.sum.Write(h)
	p, err := br.full(int(n), false)
	if err != nil {
		return kind, nil, err
	}
	// Of a chunk, the bundle's hash covers its prefix and its own hash
	// (see bundleWriter.chunk), which checked verifies against the data.
	hashed := len(p)
	switch kind {
	case bframeData:
		hashed = min(len(p), 8+sha256.Size)
	case bframeRecords:
		hashed = min(len(p), sha256.Size)
	}
	br.sum.Write(p[:hashed])
	return kind, p, nil
}

// checked splits a chunk frame's payload after pre bytes and checks its
// hash.
func checked(p []byte, pre int) ([]byte, []byte, error) {
	if len(p) < pre+sha256.Size {
		return nil, nil, errBundle("a short frame")
	}
	sum, data := p[pre:pre+sha256.Size], p[pre+sha256.Size:]
	if got := sha256.Sum256(data); !bytes.Equal(got[:], sum) {
		return nil, nil, errBundle("a chunk fails its hash")
	}
	return p[:pre], data, nil
}

// ReceiveSession stages a bundle from a peer.
func (m *Manager) ReceiveSession(ctx context.Context, r io.Reader) (_ session.MoveStaged, err error) {
	start := time.Now()
	br, hdr, err := openBundle(r)
	if err != nil {
		return session.MoveStaged{}, err
	}
	if hdr.Checkpoint != "" {
		return session.MoveStaged{}, errBundle("a replica of checkpoint %s of %q, not a move", hdr.Checkpoint, hdr.Name)
	}
	if hdr.State != session.StateStopped && hdr.State != session.StateSleeping {
		return session.MoveStaged{}, errBundle("session %q is %s; only stopped and sleeping sessions move", hdr.Name, hdr.State)
	}
	if err := m.refuseArrival(ctx, hdr); err != nil {
		return session.MoveStaged{}, err
	}
	staged := session.MoveStaged{Name: hdr.Name, State: hdr.State, Image: hdr.Image, ImageDigest: hdr.ImageDigest}
	if err := os.MkdirAll(m.movesDir(), 0o755); err != nil {
		return staged, fmt.Errorf("receive session %q: %w", hdr.Name, err)
	}
	partial, err := os.MkdirTemp(m.movesDir(), "."+hdr.Name+".partial-")
	if err != nil {
		return staged, fmt.Errorf("receive session %q: %w", hdr.Name, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(partial)
		}
	}()
	root := filepath.Join(partial, stagedSession)
	if err := os.Mkdir(root, 0o755); err != nil {
		return staged, err
	}
	recs, err := os.OpenFile(filepath.Join(partial, stagedRecords), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return staged, err
	}
	defer recs.Close()
	if err := receiveFiles(ctx, br, root, recs, &staged); err != nil {
		return staged, fmt.Errorf("receive session %q: %w", hdr.Name, err)
	}
	if staged.Records == 0 {
		return staged, errBundle("no records")
	}
	staged.Took = time.Since(start)
	return staged, m.finishStaging(partial, recs, staged)
}

// openBundle reads a bundle's magic, version and header.
func openBundle(r io.Reader) (*bundleReader, bundleHeader, error) {
	var hdr bundleHeader
	br := &bundleReader{r: bufio.NewReaderSize(r, 2*bundleChunk), sum: sha256.New()}
	head, err := br.full(len(bundleMagic)+2, true)
	if err != nil {
		return nil, hdr, err
	}
	if string(head[:len(bundleMagic)]) != bundleMagic {
		return nil, hdr, errBundle("not a move bundle")
	}
	if v := binary.BigEndian.Uint16(head[len(bundleMagic):]); v != bundleVersion {
		return nil, hdr, errBundle("version %d, this berth reads %d: run the same berth on both hosts", v, bundleVersion)
	}
	kind, p, err := br.next()
	if err != nil {
		return nil, hdr, err
	}
	if kind != bframeHeader || json.Unmarshal(p, &hdr) != nil {
		return nil, hdr, errBundle("no header")
	}
	if err := session.ValidateName(hdr.Name); err != nil {
		return nil, hdr, err
	}
	return br, hdr, nil
}

// receiveFiles reads file, data and (with recs) records frames into
// root and recs, to the end frame, which it verifies; counts go to st.
func receiveFiles(ctx context.Context, br *bundleReader, root string, recs *os.File, st *session.MoveStaged) error {
	var cur *os.File
	var curSize int64
	closeCur := func() error {
		if cur == nil {
			return nil
		}
		err := cur.Sync()
		if cerr := cur.Close(); err == nil {
			err = cerr
		}
		cur = nil
		return err
	}
	defer closeCur()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		kind, p, err := br.next()
		if err != nil {
			return err
		}
		switch kind {
		case bframeFile:
			var bf bundleFile
			if json.Unmarshal(p, &bf) != nil {
				return errBundle("a file header that does not decode")
			}
			if st.Files++; st.Files > maxBundleFiles {
				return errBundle("more than %d files", maxBundleFiles)
			}
			if bf.Size < 0 || bf.Size > maxBundleFileSize {
				return errBundle("file %q of %d bytes", bf.Path, bf.Size)
			}
			if err := closeCur(); err != nil {
				return err
			}
			if cur, err = createStaged(root, bf); err != nil {
				return err
			}
			curSize = bf.Size
		case bframeData:
			pre, data, err := checked(p, 8)
			if err != nil {
				return err
			}
			off := int64(binary.BigEndian.Uint64(pre))
			if cur == nil || off < 0 || off > curSize || int64(len(data)) > curSize-off {
				return errBundle("data out of place")
			}
			if _, err := cur.WriteAt(data, off); err != nil {
				return err
			}
			st.Bytes += int64(len(data))
		case bframeRecords:
			if recs == nil {
				return errBundle("records where none belong")
			}
			_, data, err := checked(p, 0)
			if err != nil {
				return err
			}
			if st.Records += int64(len(data)); st.Records > maxBundleRecords {
				return errBundle("records beyond %d bytes", int64(maxBundleRecords))
			}
			if _, err := recs.Write(data); err != nil {
				return err
			}
		case bframeEnd:
			if !bytes.Equal(p, br.sum.Sum(nil)) {
				return errBundle("the bundle fails its hash")
			}
			if _, err := br.r.ReadByte(); err != io.EOF {
				return errBundle("data after its end")
			}
			return closeCur()
		default:
			return errBundle("a frame of kind %q", kind)
		}
	}
}

// refuseArrival refuses a bundle this host cannot take: a session of the
// name here or staged, a VMM or image build it lacks.
func (m *Manager) refuseArrival(ctx context.Context, hdr bundleHeader) error {
	// A host below its floor takes nothing more (its own sessions'
	// writes come first), as it would make nothing new.
	if err := m.checkFloor("take session " + hdr.Name + " here"); err != nil {
		return err
	}
	if _, err := m.get(hdr.Name); err == nil {
		return &session.Error{Class: session.ErrExists, Msg: fmt.Sprintf("session %q exists on this host", hdr.Name)}
	}
	for _, p := range []string{m.sessionDir(hdr.Name), m.stagedDir(hdr.Name)} {
		if _, err := os.Lstat(p); err == nil {
			return &session.Error{Class: session.ErrExists, Msg: fmt.Sprintf("session %q is already here (%s)", hdr.Name, p),
				Hint: "discard the earlier move's staging, or delete the session here"}
		}
	}
	return m.refuseBuild(ctx, hdr)
}

// refuseBuild refuses a bundle whose VMM or image build this host lacks.
func (m *Manager) refuseBuild(ctx context.Context, hdr bundleHeader) error {
	if _, err := m.driver(hdr.VMM); err != nil {
		return err
	}
	if _, err := m.resolveImage(ctx, hdr.Image, hdr.ImageDigest); err != nil {
		return &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Code: session.CodeNoImageBuild,
			Msg:  fmt.Sprintf("this host lacks build %s of image %q that the session's system disk was made on", hdr.ImageDigest, hdr.Image),
			Hint: "ship that image build here first (a move does)", Err: err}
	}
	return nil
}

// createStaged creates one received file under root. The path is a
// peer's: it must be local (no "..", not absolute), and nothing on the
// way may be a symlink (none is made here, and the directory is new).
func createStaged(root string, bf bundleFile) (*os.File, error) {
	if !filepath.IsLocal(bf.Path) || strings.Contains(bf.Path, `\`) || filepath.Clean(bf.Path) != bf.Path {
		return nil, errBundle("path %q", bf.Path)
	}
	path := filepath.Join(root, bf.Path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	for d := filepath.Dir(path); d != root; d = filepath.Dir(d) {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return nil, errBundle("path %q", bf.Path)
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, bf.Mode.Perm()&0o755|0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, errBundle("path %q twice", bf.Path)
		}
		return nil, err
	}
	if err := f.Truncate(bf.Size); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// finishStaging makes a verified bundle durable and renames it into
// place, where CommitReceived finds it.
func (m *Manager) finishStaging(partial string, recs *os.File, staged session.MoveStaged) error {
	if err := recs.Sync(); err != nil {
		return err
	}
	b, _ := json.Marshal(staged)
	if err := writeSynced(filepath.Join(partial, stagedMetaFile), b); err != nil {
		return err
	}
	err := filepath.WalkDir(partial, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			err = syncDir(path)
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := os.Rename(partial, m.stagedDir(staged.Name)); err != nil {
		return fmt.Errorf("receive session %q: %w", staged.Name, err)
	}
	return syncDir(m.movesDir())
}

// CommitReceived makes a staged session this host's.
func (m *Manager) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	if err := session.ValidateName(name); err != nil {
		return session.Session{}, err
	}
	dir := m.stagedDir(name)
	b, err := os.ReadFile(filepath.Join(dir, stagedMetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		// Committed already (a retry), or never received.
		if s, gerr := m.get(name); gerr == nil {
			return s.snapshot(), nil
		}
		return session.Session{}, &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no move of session %q is staged here", name)}
	}
	if err != nil {
		return session.Session{}, err
	}
	var staged session.MoveStaged
	if err := json.Unmarshal(b, &staged); err != nil {
		return session.Session{}, fmt.Errorf("staged move of %q: %w", name, err)
	}
	// The session's directory goes first; a crash after it leaves it in
	// place with no record, which a retry finds and goes on from.
	src, dst := filepath.Join(dir, stagedSession), m.sessionDir(name)
	if _, err := os.Lstat(src); err == nil {
		if _, err := os.Lstat(dst); err == nil {
			return session.Session{}, &session.Error{Class: session.ErrExists, Msg: fmt.Sprintf("session %q has a directory here already (%s)", name, dst)}
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return session.Session{}, err
		}
		if err := os.Rename(src, dst); err != nil {
			return session.Session{}, fmt.Errorf("commit the move of %q: %w", name, err)
		}
		syncDir(filepath.Dir(dst))
	}
	f, err := os.Open(filepath.Join(dir, stagedRecords))
	if err != nil {
		return session.Session{}, err
	}
	defer f.Close()
	rec, err := m.st.ImportSession(f, func(r *store.Session) error {
		if staged.Checkpoint != "" {
			// A recovery: the records were copied from a session in any
			// state on a host now gone; here it starts stopped, on the
			// checkpoint's disks (swapped in below).
			r.State = string(session.StateStopped)
			r.SnapshotPath, r.SnapshotBytes = "", 0
		}
		if r.State != string(session.StateStopped) && r.State != string(session.StateSleeping) {
			return fmt.Errorf("its record says %s: %w", r.State, session.ErrInvalidState)
		}
		r.Pid = 0
		if r.SnapshotPath != "" {
			r.SnapshotPath = filepath.Join(dst, "snapshot", filepath.Base(r.SnapshotPath))
		}
		return nil
	})
	if errors.Is(err, store.ErrExists) {
		// Imported by an earlier try that the process did not outlive,
		// or whose recovery's swap failed (its intent is still there).
		if s, gerr := m.get(name); gerr == nil {
			if staged.Checkpoint != "" {
				if err := s.finishRecoverOnto(ctx, staged.Checkpoint); err != nil {
					return session.Session{}, fmt.Errorf("commit the recovery of %q: %w", name, err)
				}
			}
			os.RemoveAll(dir)
			return s.snapshot(), nil
		}
	}
	if err != nil {
		return session.Session{}, fmt.Errorf("commit the move of %q: %w", name, err)
	}
	s, err := m.claim(rec)
	if err != nil {
		return session.Session{}, err
	}
	m.loadHarnessOf(name)
	how := fmt.Sprintf("%s: moved here (%d files, %d bytes of data)", rec.State, staged.Files, staged.Bytes)
	if staged.Checkpoint != "" {
		if err := s.recoverOnto(ctx, staged.Checkpoint); err != nil {
			s.op.Unlock()
			return session.Session{}, fmt.Errorf("commit the recovery of %q: %w", name, err)
		}
		how = fmt.Sprintf("%s: recovered here from its replica of checkpoint %s", s.state(), staged.Checkpoint)
	}
	s.refreshCheckpoints()
	s.op.Unlock()
	os.RemoveAll(dir)
	syncDir(m.movesDir())
	m.event(session.Event{Kind: session.EventState, Name: name, By: session.Actor(ctx), Session: ptr(s.snapshot()), Message: how})
	return s.snapshot(), nil
}

func ptr[T any](v T) *T { return &v }

// DiscardReceived removes what is staged for name.
func (m *Manager) DiscardReceived(ctx context.Context, name string) error {
	if err := session.ValidateName(name); err != nil {
		return err
	}
	if err := os.RemoveAll(m.stagedDir(name)); err != nil {
		return fmt.Errorf("discard the staged move of %q: %w", name, err)
	}
	// A partial staging of the name, from a receive still running or one
	// that a crash cut, goes too: the receive that wrote it fails.
	dirs, _ := filepath.Glob(filepath.Join(m.movesDir(), "."+name+".partial-*"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
	return nil
}

// DropSent removes this host's copy of a session the target has taken.
func (m *Manager) DropSent(ctx context.Context, name string) error {
	s, err := m.get(name)
	if err != nil {
		return unknownSession(name, err)
	}
	s.op.Lock()
	defer s.op.Unlock()
	if err := s.checkMove(); err != nil {
		return err
	}
	// A session started, woken or restored here after it was sent has
	// moved on from the copy the target took. (After a restart of this
	// daemon there is no mark: the fleet's epoch fences that case.)
	if sent := s.sent.Load(); sent != 0 && sent != s.changes.Load()+1 {
		return &session.Error{Class: session.ErrConflict, Msg: fmt.Sprintf("session %q changed on this host after it was sent", name),
			Hint: "the copy sent is stale: discard it on the target and move the session again"}
	}
	m.removeSession(s, "moved to another host by "+session.Actor(ctx))
	return nil
}
