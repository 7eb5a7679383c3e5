package agent

import (
	"fmt"
	"io"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
)

// Directory trees in and out of /workspace travel as tar streams in data
// frames (package tree has the rules: durable unpacking, confinement,
// symlinks kept and checked).

// frameReader reads a stream's data frames as bytes, until FrameEnd.
type frameReader struct {
	s      *stream
	buf    []byte
	end    bool
	waited time.Duration // in Next: the host's bytes not there yet
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.end {
			return 0, io.EOF
		}
		start := time.Now()
		t, data, err := r.s.fr.Next()
		r.waited += time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("copy interrupted: %w", err)
		}
		switch t {
		case guest.FrameData:
			r.buf = data
		case guest.FrameEnd:
			r.end = true
		default:
			return 0, &guest.Error{Code: guest.CodeBadRequest, Op: guest.OpUnpack, Message: "unexpected frame in a tree upload"}
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// frameWriter sends bytes as data frames of at most DataChunk. buf holds
// a frame header's room, then the bytes: one write per frame.
type frameWriter struct {
	s   *stream
	buf []byte
}

func newFrameWriter(s *stream) *frameWriter {
	return &frameWriter{s: s, buf: make([]byte, guest.FrameHeader, guest.FrameHeader+guest.DataChunk)}
}

func (w *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		room := cap(w.buf) - len(w.buf)
		k := min(room, len(p))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == cap(w.buf) {
			if err := w.Flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *frameWriter) Flush() error {
	if len(w.buf) == guest.FrameHeader {
		return nil
	}
	err := w.s.sendBuf(guest.FrameData, w.buf)
	w.buf = w.buf[:guest.FrameHeader]
	return err
}

func (a *Agent) unpack(s *stream, p string, owner *tree.Owner) (guest.TreeResult, error) {
	root, dest, err := a.open(p)
	if err != nil {
		return guest.TreeResult{}, err
	}
	// One syncfs per batch: a fsync per file is a flush of the host's
	// image file per file, 2,000 of them for a tree of 2,000 files.
	sync, done, err := tree.SyncFS(root)
	if err != nil {
		return guest.TreeResult{}, err
	}
	defer done()
	fr := &frameReader{s: s}
	res, err := tree.Unpack(root, dest, fr, tree.Options{Sync: sync, Owner: owner})
	res.Waited = fr.waited
	return res, escapeErr(err)
}

// pack streams the tree at p as a tar.
func (a *Agent) pack(s *stream, p string) error {
	root, src, err := a.open(p)
	if err != nil {
		return err
	}
	fw := newFrameWriter(s)
	res, err := tree.Pack(root, src, fw, nil)
	if err != nil {
		return escapeErr(err)
	}
	if err := fw.Flush(); err != nil {
		return nil
	}
	if err := s.send(guest.FrameEnd, nil); err != nil {
		return nil
	}
	s.sendJSON(guest.FrameResult, res)
	return nil
}
