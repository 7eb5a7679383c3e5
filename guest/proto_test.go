package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"syscall"
	"testing"
)

func TestFrames(t *testing.T) {
	var b bytes.Buffer
	big := bytes.Repeat([]byte("x"), 100000)
	WriteFrame(&b, FrameStdout, []byte("small"))
	WriteFrame(&b, FrameData, big)
	WriteFrame(&b, FrameEnd, nil)
	buf := make([]byte, FrameHeader+3)
	copy(buf[FrameHeader:], "abc")
	WriteFrameBuf(&b, FrameStderr, buf)
	fr := NewFrameReader(&b)
	want := []struct {
		t FrameType
		p []byte
	}{{FrameStdout, []byte("small")}, {FrameData, big}, {FrameEnd, nil}, {FrameStderr, []byte("abc")}}
	for i, w := range want {
		typ, p, err := fr.Next()
		if err != nil || typ != w.t || !bytes.Equal(p, w.p) {
			t.Fatalf("frame %d: %d %d bytes %v", i, typ, len(p), err)
		}
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestFrameReaderRefusesHugeAndTruncated(t *testing.T) {
	var hdr [5]byte
	hdr[0] = byte(FrameData)
	binary.BigEndian.PutUint32(hdr[1:], 1<<31) // a hostile length
	if _, _, err := NewFrameReader(bytes.NewReader(hdr[:])).Next(); err == nil {
		t.Fatal("a 2 GiB frame was accepted")
	}
	binary.BigEndian.PutUint32(hdr[1:], 10)
	if _, _, err := NewFrameReader(bytes.NewReader(append(hdr[:], 1, 2))).Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated frame: %v", err)
	}
	if err := WriteFrame(io.Discard, FrameData, make([]byte, MaxFrame+100)); err == nil {
		t.Fatal("an oversized frame was written")
	}
}

func TestErrorCodes(t *testing.T) {
	tests := []struct {
		code string
		is   error
	}{
		{"ENOENT", fs.ErrNotExist}, {"ENOSPC", syscall.ENOSPC}, {"EISDIR", syscall.EISDIR},
		{"EEXIST", fs.ErrExist}, {CodeEscape, ErrEscape}, {CodeNoWorkspace, ErrNoWorkspace},
		{CodeUnknownExec, ErrUnknownExec},
	}
	for _, tt := range tests {
		if err := error(&Error{Code: tt.code, Message: "m"}); !errors.Is(err, tt.is) {
			t.Errorf("%s does not match %v", tt.code, tt.is)
		}
	}
	e := ErrorFrom("write", "f", &fs.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC})
	if e.Code != "ENOSPC" || e.Message != "no space left on device" {
		t.Errorf("ErrorFrom = %+v", e)
	}
	long := (&Error{Code: "EIO", Message: string(bytes.Repeat([]byte("g"), 5000))}).Error()
	if len(long) > 600 {
		t.Errorf("guest text not bounded: %d bytes", len(long))
	}
}

func TestLineScannerFindsMarkerAfterGarbage(t *testing.T) {
	garbage := append(bytes.Repeat([]byte{0, 0xff, 'S'}, 500), []byte("BERTH-ACK 1 abc\n")...)
	sc := &lineScanner{br: bufioReader(garbage)}
	line, err := sc.next()
	if err != nil {
		t.Fatal(err)
	}
	if rest, ok := field(line, lineAck); !ok || rest != "1 abc" {
		t.Fatalf("marker not found: %q %v", rest, ok)
	}
}
