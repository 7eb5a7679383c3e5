package agent

import (
	"testing"
	"time"
)

// Close unblocks an Accept in progress: the agent's ServeVsock ends with
// its context instead of leaking a goroutine stuck in accept(2).
func TestVsockCloseUnblocksAccept(t *testing.T) {
	l, err := listenVsock(52000 + uint32(time.Now().UnixNano()%1000))
	if err != nil {
		t.Skipf("no vsock here: %v", err)
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	time.Sleep(50 * time.Millisecond) // let Accept block
	l.Close()
	select {
	case err := <-accepted:
		if err == nil {
			t.Fatal("Accept returned a connection after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
}
