package oci

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/berthvm/berth/guest/image"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// layerRef is one layer of the image being imported.
type layerRef struct {
	n, of int // its position, from 1, and the image's layer count
	// open returns the layer's blob and its size.
	open func() (io.ReadCloser, int64, error)
	// digest is the blob's digest to check ("" when the source names
	// none: a docker archive's legacy layer.tar, a rootfs tarball) and
	// size its size (-1 when not known).
	digest string
	size   int64
	comp   compression
	// diffID is what the uncompressed tar hashes to (the image config
	// says); empty for a rootfs tarball until scanned.
	diffID string
	// blob is the layer's blob as the blob cache keeps it, once kept.
	blob image.Blob
	// unpacked and content are what scanning measured: the tar's size
	// and what its files take on disk.
	unpacked, content int64
}

func (l *layerRef) String() string {
	d := l.diffID
	if l.digest != "" {
		d = l.digest
	}
	if d == "" {
		return fmt.Sprintf("layer %d of %d", l.n, l.of)
	}
	return fmt.Sprintf("layer %d of %d (%s)", l.n, l.of, short(d))
}

// errTooBig is a layer unpacking to more than it may.
type errTooBig struct{ limit int64 }

func (e errTooBig) Error() string { return fmt.Sprintf("unpacks to more than %s", gb(e.limit)) }

// counted hashes and counts what is read through it, refusing to go
// past limit (0: no limit).
type counted struct {
	r     io.Reader
	h     hash.Hash
	n     int64
	limit int64
}

func (c *counted) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.h.Write(p[:n])
		c.n += int64(n)
		if c.limit > 0 && c.n > c.limit {
			return n, errTooBig{c.limit}
		}
	}
	return n, err
}

// layerStream reads one layer: its blob hashed and counted as it is
// read, decompressed, the tar inside hashed (the diff id) and bounded.
// Nothing read through it is to be trusted until finish returns nil.
type layerStream struct {
	l      *layerRef
	blob   io.ReadCloser
	packed *counted
	dec    io.ReadCloser
	plain  *counted
	tr     *tar.Reader
}

// openLayer starts reading l, its uncompressed tar bounded by limit.
func openLayer(l *layerRef, limit int64) (*layerStream, error) { return openLayerKeep(l, limit, nil) }

// openLayerKeep is openLayer writing the blob's bytes, as they are read,
// to keep (when not nil): the import keeps the blob as it came.
func openLayerKeep(l *layerRef, limit int64, keep io.Writer) (*layerStream, error) {
	blob, size, err := l.open()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l, err)
	}
	if l.size >= 0 && size != l.size {
		blob.Close()
		return nil, fmt.Errorf("%s is %d bytes and the manifest says %d: the source is corrupt or truncated", l, size, l.size)
	}
	algo := l.digest
	if algo == "" {
		algo = "sha256:"
	}
	s := &layerStream{l: l, blob: blob}
	// Reading one byte past the size tells a longer blob from a whole one.
	var packed io.Reader = io.LimitReader(blob, size+1)
	if keep != nil {
		packed = io.TeeReader(packed, keep)
	}
	s.packed = &counted{r: packed, h: newHash(algo)}
	s.dec, err = decompressor(s.packed, l.comp)
	if err != nil {
		blob.Close()
		return nil, fmt.Errorf("%s: %w", l, s.why(err))
	}
	diff := l.diffID
	if diff == "" {
		diff = "sha256:"
	}
	s.plain = &counted{r: s.dec, h: newHash(diff), limit: limit}
	// tar reads in blocks and skips through small buffers: decompress
	// and hash in large reads instead.
	s.tr = tar.NewReader(bufio.NewReaderSize(s.plain, 1<<20))
	return s, nil
}

// next is the tar's next entry.
func (s *layerStream) next() (*tar.Header, error) {
	h, err := s.tr.Next()
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", s.l, s.why(err))
	}
	return h, err
}

// why names the cause of a read error: a layer too big, a truncated
// blob or tar, a blob that is not what its media type says.
func (s *layerStream) why(err error) error {
	var big errTooBig
	switch {
	case errors.As(err, &big):
		return err
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("truncated: the tar or its compression ends early (%w)", err)
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum):
		return fmt.Errorf("corrupt gzip data (%w)", err)
	case errors.Is(err, tar.ErrHeader):
		return fmt.Errorf("not a tar, or a corrupt one (%w)", err)
	}
	return err
}

// finish reads what is left after the tar's end (the digests cover the
// whole blob) and checks the blob's size and digest and the diff id.
// It returns the diff id.
func (s *layerStream) finish() (string, error) {
	if _, err := io.Copy(io.Discard, s.plain); err != nil {
		return "", fmt.Errorf("%s: %w", s.l, s.why(err))
	}
	if err := s.dec.Close(); err != nil {
		return "", fmt.Errorf("%s: %w", s.l, s.why(err))
	}
	// A compressed stream may end before its blob does.
	if _, err := io.Copy(io.Discard, s.packed); err != nil {
		return "", fmt.Errorf("%s: %w", s.l, s.why(err))
	}
	if s.l.size >= 0 && s.packed.n != s.l.size {
		return "", fmt.Errorf("%s: read %d bytes of %d: the source is truncated or corrupt", s.l, s.packed.n, s.l.size)
	}
	if s.l.digest != "" {
		if got := sum(s.packed.h, s.l.digest); got != s.l.digest {
			return "", fmt.Errorf("%s does not match its digest (it hashes to %s): the source is corrupt", s.l, short(got))
		}
	}
	got := sum(s.plain.h, "sha256:")
	if s.l.diffID != "" {
		got = sum(s.plain.h, s.l.diffID)
		if got != s.l.diffID {
			return "", fmt.Errorf("%s unpacks to %s, and the image config says %s: the source is corrupt", s.l, short(got), short(s.l.diffID))
		}
	}
	return got, nil
}

func (s *layerStream) Close() {
	s.dec.Close()
	s.blob.Close()
}

// decompressor undoes a layer's compression, looking at the bytes where
// the source does not say (sniff).
func decompressor(r io.Reader, c compression) (io.ReadCloser, error) {
	if c == sniff {
		br := bufio.NewReader(r)
		magic, _ := br.Peek(4)
		c, r = compressionOf(magic), br
	}
	switch c {
	case gzipped:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		return zr, nil
	case zstded:
		// The window bounds the decoder's memory, whatever the stream
		// asks for.
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20), zstd.WithDecoderMaxMemory(1<<30))
		if err != nil {
			return nil, err
		}
		return zstdCloser{zr}, nil
	}
	return io.NopCloser(r), nil
}

type zstdCloser struct{ *zstd.Decoder }

func (z zstdCloser) Close() error { z.Decoder.Close(); return nil }

// gb formats a byte count for people.
func gb(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d bytes", n)
}
