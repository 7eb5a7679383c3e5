package sshd

import (
	"io"
	"net"
	"testing"
)

// Accepted TCP connections acknowledge their first reads at once, and only
// those: the budget ends after the handshake's bytes.
func TestQuickAckConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sl := &startedListener{Listener: ln, started: make(chan struct{})}
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(make([]byte, quickAckBytes+1000))
	}()
	c, err := sl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	qc, ok := c.(*quickAckConn)
	if !ok {
		t.Fatalf("Accept gave a %T, want a *quickAckConn", c)
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != quickAckBytes+1000 {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	if qc.bytes < quickAckBytes || int64(qc.bytes) > n || qc.reads > quickAckReads {
		t.Errorf("quick acks for %d reads, %d bytes of %d", qc.reads, qc.bytes, n)
	}
	if pipe, _ := net.Pipe(); withQuickAck(pipe) != pipe {
		t.Error("a connection that is not TCP was wrapped")
	}
}
