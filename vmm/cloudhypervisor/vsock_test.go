package cloudhypervisor

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// muxer is a scripted stand-in for CH's vsock muxer: for each connection
// it reads the CONNECT line byte by byte and hands the connection and its
// 1-based attempt number to script.
type muxer struct {
	attempts atomic.Int32
	lines    chan string
}

func serveMuxer(t *testing.T, path string, script func(attempt int, c net.Conn)) *muxer {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	m := &muxer{lines: make(chan string, 100)}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(m.attempts.Add(1))
			go func() {
				var line []byte
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil {
						c.Close()
						return
					}
					line = append(line, b[0])
					if b[0] == '\n' {
						break
					}
				}
				m.lines <- string(line)
				script(n, c)
			}()
		}
	}()
	return m
}

func sockPath(t *testing.T) string { return filepath.Join(t.TempDir(), "v.sock") }

func TestVsockHandshake(t *testing.T) {
	path := sockPath(t)
	m := serveMuxer(t, path, func(_ int, c net.Conn) {
		// The OK line and the guest's first bytes in one write: a dialer
		// that buffers would swallow them.
		io.WriteString(c, "OK 1073741824\nguest bytes")
		io.Copy(c, c)
		c.Close()
	})
	conn, err := VsockDialer{}.Dial(context.Background(), path, AgentPort)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := <-m.lines; got != "CONNECT 1024\n" {
		t.Errorf("muxer got %q", got)
	}
	buf := make([]byte, len("guest bytes"))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "guest bytes" {
		t.Fatalf("first bytes after OK = %q, %v", buf, err)
	}
	io.WriteString(conn, "x")
	if _, err := io.ReadFull(conn, buf[:1]); err != nil || buf[0] != 'x' {
		t.Fatalf("echo = %q, %v", buf[:1], err)
	}
	if dl, ok := conn.(*net.UnixConn); !ok {
		t.Errorf("conn is %T", conn)
	} else if err := dl.SetDeadline(time.Time{}); err != nil {
		t.Error(err)
	}
}

// TestVsockGuestNotListening: CH closes the connection while nothing in
// the guest listens; the dialer retries until the guest accepts.
func TestVsockGuestNotListening(t *testing.T) {
	path := sockPath(t)
	m := serveMuxer(t, path, func(n int, c net.Conn) {
		if n < 3 {
			c.Close()
			return
		}
		io.WriteString(c, "OK 5\n")
		c.Close()
	})
	conn, err := VsockDialer{}.Dial(context.Background(), path, 7)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if got := m.attempts.Load(); got != 3 {
		t.Errorf("attempts = %d, want 3", got)
	}
}

func TestVsockGarbage(t *testing.T) {
	for _, reply := range []string{
		"ERROR\n",
		"OK\n",
		"OK \n",
		"OK abc\n",
		"ok 5\n",
		"OK 99999999999\n", // over u32
		"OK 1111111111111111111111111111111111111111", // too long, no newline
		"HTTP/1.1 400 Bad Request\r\n",
	} {
		t.Run(reply, func(t *testing.T) {
			path := sockPath(t)
			m := serveMuxer(t, path, func(_ int, c net.Conn) {
				io.WriteString(c, reply)
				c.Close()
			})
			_, err := VsockDialer{MaxWait: 5 * time.Second}.Dial(context.Background(), path, 1024)
			if !errors.Is(err, ErrVsockReply) {
				t.Fatalf("= %v, want ErrVsockReply", err)
			}
			if got := m.attempts.Load(); got != 1 {
				t.Errorf("attempts = %d, want 1 (garbage is not retried)", got)
			}
		})
	}
}

// TestVsockStaleSocket: a socket file nobody listens on (a VMM killed
// without cleanup) is retried, then reported with its cause.
func TestVsockStaleSocket(t *testing.T) {
	path := sockPath(t)
	staleSocket(t, path)
	start := time.Now()
	_, err := VsockDialer{MaxWait: 200 * time.Millisecond}.Dial(context.Background(), path, 1024)
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("= %v, want ECONNREFUSED after the deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s with MaxWait 200ms", d)
	}
}

// TestVsockSocketAppears: dialing before the VMM created the socket waits
// for it.
func TestVsockSocketAppears(t *testing.T) {
	path := sockPath(t)
	errc := make(chan error, 1)
	go func() {
		conn, err := VsockDialer{MaxWait: 10 * time.Second}.Dial(context.Background(), path, 1024)
		if err == nil {
			conn.Close()
		}
		errc <- err
	}()
	serveMuxer(t, path, func(_ int, c net.Conn) { io.WriteString(c, "OK 1\n"); c.Close() })
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestVsockHandshakeTimeout: a request that is never answered (the guest
// kernel race Kata works around) is retried after HandshakeTimeout.
func TestVsockHandshakeTimeout(t *testing.T) {
	path := sockPath(t)
	hold := make(chan struct{})
	defer close(hold)
	m := serveMuxer(t, path, func(n int, c net.Conn) {
		defer c.Close()
		if n == 1 {
			<-hold
			return
		}
		io.WriteString(c, "OK 2\n")
	})
	conn, err := VsockDialer{HandshakeTimeout: 100 * time.Millisecond}.Dial(context.Background(), path, 1024)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if got := m.attempts.Load(); got != 2 {
		t.Errorf("attempts = %d, want 2", got)
	}
}

func TestVsockCancel(t *testing.T) {
	path := sockPath(t)
	hold := make(chan struct{})
	defer close(hold)
	m := serveMuxer(t, path, func(_ int, c net.Conn) { <-hold; c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := VsockDialer{}.Dial(ctx, path, 1024)
		errc <- err
	}()
	<-m.lines // the request is waiting for its answer
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("= %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Dial ignored cancellation")
	}
}
