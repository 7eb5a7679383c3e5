package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The blob cache keeps the OCI blobs imported images were made of (their
// layers as they came, compressed or not, their configs and manifests),
// by digest, in <images>/.blobs/<alg>/<hex>: an ext4 layer cannot give
// back the tar it was made from byte for byte, and an export that did
// not would change the image's layer digests, so that the same image
// exported from two hosts would be two images. Builds link the blobs
// they use into blobs/<alg>/<hex> of their directory; a blob no build
// links goes at the next prune, once it has been unlinked for blobKeep
// (an import writes its blobs before the build that links them exists).

// blobKeep is how long a blob no build links is kept.
const blobKeep = time.Hour

// BlobCacheDir is where kept blobs live; temporary files made in it
// (BlobTemp) are renamed into place by KeepBlob.
func BlobCacheDir(imagesDir string) string { return filepath.Join(imagesDir, blobCache) }

// blobRel is a digest's path under a blob directory: <alg>/<hex>.
func blobRel(digest string) (string, error) {
	alg, hex, ok := strings.Cut(digest, ":")
	if !ok || (alg != "sha256" && alg != "sha512") || hex == "" || len(hex) > 128 || strings.ContainsAny(hex, "/.\x00") {
		return "", fmt.Errorf("bad blob digest %q", digest)
	}
	return filepath.Join(alg, hex), nil
}

// CachedBlob returns the path of the cached blob digest when it is
// there with size bytes (size < 0: any).
func CachedBlob(imagesDir, digest string, size int64) (string, bool) {
	rel, err := blobRel(digest)
	if err != nil {
		return "", false
	}
	p := filepath.Join(BlobCacheDir(imagesDir), rel)
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() || (size >= 0 && fi.Size() != size) {
		return "", false
	}
	return p, true
}

// BlobTemp makes a temporary file in the blob cache to write a blob
// into; KeepBlob moves it into place once its digest is known.
func BlobTemp(imagesDir string) (*os.File, error) {
	dir := BlobCacheDir(imagesDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.CreateTemp(dir, ".tmp-")
}

// KeepBlob syncs the temporary file tmp (from BlobTemp, closed) and
// renames it into the cache as digest, which the caller has checked it
// hashes to. A blob already there is kept and tmp removed.
func KeepBlob(imagesDir, tmp, digest string) (string, error) {
	rel, err := blobRel(digest)
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	p := filepath.Join(BlobCacheDir(imagesDir), rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := syncFile(tmp); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return p, nil
}

// blobDigests lists every blob an image links: its layers', its
// config's and its manifest's.
func blobDigests(im Image) []string {
	var out []string
	for _, l := range im.Layers {
		for _, b := range l.Blobs {
			out = append(out, b.Digest)
		}
	}
	for _, d := range []string{im.ConfigBlob, im.ManifestBlob} {
		if d != "" {
			out = append(out, d)
		}
	}
	return out
}

// linkBlobs links the blobs im uses from the cache into the build
// directory dir.
func linkBlobs(imagesDir, dir string, im Image) error {
	for _, d := range blobDigests(im) {
		rel, err := blobRel(d)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, "blobs", rel)
		if _, err := os.Lstat(dst); err == nil {
			continue // the same blob twice
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Link(filepath.Join(BlobCacheDir(imagesDir), rel), dst); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("blob %s is not in the blob cache %s: import the image again", d, BlobCacheDir(imagesDir))
			}
			return fmt.Errorf("link blob: %w", err)
		}
	}
	return nil
}

// BlobPath is where the build im keeps blob digest (linked in when it
// was committed); it may not be there (a build from before blobs were
// kept).
func (im Image) BlobPath(digest string) (string, error) {
	rel, err := blobRel(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(im.Dir, "blobs", rel), nil
}

// pruneBlobs drops blobs no build links that have been unlinked for
// blobKeep (ctime is the last link or unlink), and temporary files as
// old: an import dead before it renamed them.
func pruneBlobs(imagesDir string) {
	dir := BlobCacheDir(imagesDir)
	old := func(st *syscall.Stat_t) bool {
		return time.Since(time.Unix(st.Ctim.Unix())) > blobKeep
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	for _, f := range append(files, tmps...) {
		var st syscall.Stat_t
		if syscall.Lstat(f, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG && st.Nlink == 1 && old(&st) {
			os.Remove(f)
		}
	}
}
