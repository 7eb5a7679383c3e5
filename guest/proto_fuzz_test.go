package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// frame builds one frame's bytes for the seeds.
func frameBytes(t FrameType, payload []byte) []byte {
	b := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// FuzzFrames feeds arbitrary bytes, as a hostile guest sends them, to the
// host's FrameReader. Property: every frame it returns re-encodes
// (WriteFrame) to exactly the bytes it consumed, so nothing is lost,
// reordered or invented; no payload exceeds the limit; a stream that ends
// inside a frame is ErrUnexpectedEOF and one that ends between frames
// io.EOF; a length over the limit is refused before its payload is read.
// Frames the host decodes further (output offsets, agent errors) decode
// without surprises: an agent's error text is bounded and valid UTF-8.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{})
	f.Add(frameBytes(FrameStdout, append(make([]byte, 8), "hello"...)))
	f.Add(append(frameBytes(FrameRequest, []byte(`{"op":"stat","path":"a"}`)), frameBytes(FrameEnd, nil)...))
	f.Add(frameBytes(FrameError, []byte(`{"code":"ENOENT","op":"stat","path":"/workspace/x","message":"no such file"}`)))
	f.Add(frameBytes(FrameError, []byte(`{"code":"EIO","op":"write","path":"/workspace/`+strings.Repeat("d/", 1000)+`","message":"x`+strings.Repeat("é", 300)+`"}`)))
	f.Add([]byte{byte(FrameData), 0xff, 0xff, 0xff, 0xff, 1, 2, 3})
	f.Add([]byte{byte(FrameData), 0, 0x10, 0, 8})                       // exactly MaxFrame+8, cut short
	f.Add(append(frameBytes(FrameExit, []byte(`{"id":"x"}`)), 9, 0, 0)) // a header cut short
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &countingReader{r: bytes.NewReader(in)}
		fr := NewFrameReader(r)
		consumed := 0
		for {
			typ, p, err := fr.Next()
			if err != nil {
				rest := in[consumed:]
				switch {
				case len(rest) == 0:
					if err != io.EOF {
						t.Fatalf("end between frames: %v, want io.EOF", err)
					}
				case len(rest) < FrameHeader:
					if !errors.Is(err, io.ErrUnexpectedEOF) {
						t.Fatalf("header cut short: %v, want ErrUnexpectedEOF", err)
					}
				default:
					n := binary.BigEndian.Uint32(rest[1:])
					switch {
					case n > MaxFrame+8:
						if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
							t.Fatalf("a %d byte frame: %v, want the limit's error", n, err)
						}
						if r.n > consumed+FrameHeader {
							t.Fatalf("read %d bytes of a refused frame's payload", r.n-consumed-FrameHeader)
						}
					case int(n) > len(rest)-FrameHeader:
						if err != io.ErrUnexpectedEOF {
							t.Fatalf("payload cut short: %v, want ErrUnexpectedEOF", err)
						}
					default:
						t.Fatalf("a whole frame refused: %v", err)
					}
				}
				return
			}
			if len(p) > MaxFrame+8 {
				t.Fatalf("payload of %d bytes over the limit", len(p))
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, typ, p); err != nil {
				t.Fatalf("re-encoding a frame the reader accepted: %v", err)
			}
			end := consumed + out.Len()
			if end > len(in) || !bytes.Equal(out.Bytes(), in[consumed:end]) {
				t.Fatalf("frame %d (%d bytes) does not re-encode to the bytes read", typ, len(p))
			}
			consumed = end
			if r.n != consumed {
				t.Fatalf("reader consumed %d bytes, frames account for %d", r.n, consumed)
			}
			checkFramePayload(t, typ, p)
		}
	})
}

// checkFramePayload decodes a payload as the host does.
func checkFramePayload(t *testing.T, typ FrameType, p []byte) {
	switch typ {
	case FrameError:
		err := decodeError(p)
		var e *Error
		if !errors.As(err, &e) {
			return // unreadable: reported as such
		}
		msg := err.Error()
		if len(msg) > maxErrorText {
			t.Fatalf("an agent error of %d bytes reaches a person (limit %d)", len(msg), maxErrorText)
		}
		// JSON decoding makes every string valid UTF-8; cutting must
		// not break that.
		if !utf8.ValidString(msg) {
			t.Fatalf("an agent error became invalid UTF-8: %q", msg)
		}
	}
}

// maxErrorText bounds an agent error's text as a person sees it: op,
// path and message of at most 512 bytes each, and separators.
const maxErrorText = 3*(maxErrorPart+len("…")) + 4

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
