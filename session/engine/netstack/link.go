package netstack

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// QEMU's stream netdev (-netdev stream) carries each Ethernet frame after
// its length, 4 bytes big endian (net/stream.c, as the old socket netdev).

// ethHeader is an Ethernet header's size: a frame shorter carries nothing.
const ethHeader = 14

// maxFrame bounds a frame from the guest: the MTU plus the Ethernet
// header, with room for a VLAN tag. QEMU sends nothing larger (its stream
// backend has no offloads), so a larger length is a broken stream.
const maxFrame = 65535 + ethHeader + 4

var errFrameSize = errors.New("frame length out of bounds")

// readFrame reads one frame into buf (at least maxFrame long) and returns
// it. A length that is out of bounds fails: the stream cannot be resynced.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size < ethHeader || size > maxFrame {
		return nil, fmt.Errorf("%w: %d bytes (the stream from QEMU is out of step)", errFrameSize, size)
	}
	f := buf[:size]
	if _, err := io.ReadFull(r, f); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return f, nil
}

// appendFrame appends a frame of the given parts, length first.
func appendFrame(out []byte, parts ...[]byte) []byte {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	out = binary.BigEndian.AppendUint32(out, uint32(size))
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
