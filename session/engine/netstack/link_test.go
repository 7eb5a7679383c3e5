package netstack

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func TestNetstackReadFrame(t *testing.T) {
	frame := bytes.Repeat([]byte{7}, 60)
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
		err  error
	}{
		{"one frame", appendFrame(nil, frame[:20], frame[20:]), frame, nil},
		{"the smallest frame", appendFrame(nil, frame[:ethHeader]), frame[:ethHeader], nil},
		{"shorter than a header", appendFrame(nil, frame[:ethHeader-1]), nil, errFrameSize},
		{"a length past the bound", binary.BigEndian.AppendUint32(nil, maxFrame+1), nil, errFrameSize},
		{"cut inside the frame", appendFrame(nil, frame)[:30], nil, io.ErrUnexpectedEOF},
		{"cut inside the length", []byte{0, 0}, nil, io.ErrUnexpectedEOF},
		{"nothing", nil, nil, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readFrame(bufio.NewReader(bytes.NewReader(tc.in)), make([]byte, maxFrame))
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("frame %x, want %x", got, tc.want)
			}
		})
	}
}

// FuzzNetstackFrames feeds the frame reader what a guest (through QEMU)
// could send: it never panics, never returns a frame out of bounds, and
// what it returns is what the stream held.
func FuzzNetstackFrames(f *testing.F) {
	f.Add(appendFrame(nil, bytes.Repeat([]byte{1}, 64)))
	f.Add(append(appendFrame(nil, bytes.Repeat([]byte{1}, 14)), 0, 0, 0xff, 0xff))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		buf := make([]byte, maxFrame)
		off := 0
		for {
			got, err := readFrame(r, buf)
			if err != nil {
				return
			}
			if len(got) < ethHeader || len(got) > maxFrame {
				t.Fatalf("frame of %d bytes", len(got))
			}
			if !bytes.Equal(got, in[off+4:off+4+len(got)]) {
				t.Fatal("frame differs from the stream")
			}
			off += 4 + len(got)
		}
	})
}
