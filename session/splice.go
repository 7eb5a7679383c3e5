package session

import (
	"io"
	"net"
	"sync"
)

type closeWriter interface{ CloseWrite() error }

// SpliceBuffer is the copy buffer of each direction of a Splice: in an
// emulated guest every multiplexer frame costs, so a frame carries as much
// as one read returns.
const SpliceBuffer = 256 << 10

// Splice copies between a and b both ways until both directions end, then
// closes both. The end of one direction is passed on as a half close where
// the other side supports one; an error in either direction ends both. It
// returns the bytes copied each way.
func Splice(a, b net.Conn) (aToB, bToA int64) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	cp := func(dst, src net.Conn, n *int64) {
		// Large reads batch what is waiting into few multiplexer frames;
		// each read is written at once, so interactive traffic is not held.
		buf := make([]byte, SpliceBuffer)
		var err error
		*n, err = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
		if err != nil {
			closeBoth()
			return
		}
		if cw, ok := dst.(closeWriter); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		closeBoth()
	}
	var wg sync.WaitGroup
	wg.Go(func() { cp(b, a, &aToB) })
	cp(a, b, &bToA)
	wg.Wait()
	closeBoth()
	return aToB, bToA
}
