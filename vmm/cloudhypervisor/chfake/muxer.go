package chfake

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Hybrid vsock limits, as in CH's muxer: the command is at most 32 bytes
// and a request not completed within 2 s is dropped.
const (
	maxCommandLen  = 32
	connectTimeout = 2 * time.Second
)

// muxer is the host end of a VM's hybrid vsock device: it reads
// "CONNECT <port>\n" and, if a guest service listens on port, answers
// "OK <host port>\n" and hands the connection to it. Otherwise it closes
// the connection without a word, as CH does when the guest resets it.
type muxer struct {
	ln *net.UnixListener
	s  *Server

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	nextPort uint32
	closed   bool
	wg       sync.WaitGroup
}

func listenMuxer(path string, s *Server) (*muxer, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	m := &muxer{ln: ln, s: s, conns: make(map[net.Conn]struct{}), nextPort: 1 << 30}
	m.wg.Add(1)
	// Ends when close closes the listener.
	go m.accept()
	return m, nil
}

func (m *muxer) accept() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			return
		}
		if !m.track(c) {
			c.Close()
			return
		}
		m.wg.Add(1)
		// Ends when the guest service returns, or when close closes c.
		go func() {
			defer m.wg.Done()
			defer m.untrack(c)
			m.serve(c)
		}()
	}
}

func (m *muxer) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *muxer) untrack(c net.Conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.conns, c)
	c.Close()
}

func (m *muxer) serve(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(connectTimeout))
	port, err := readConnect(c)
	if err != nil {
		m.s.logf("vsock: %v", err)
		return
	}
	h := m.s.guest(port)
	if h == nil {
		return // the guest resets; CH closes the socket silently
	}
	c.SetReadDeadline(time.Time{})
	m.mu.Lock()
	m.nextPort++
	local := m.nextPort
	m.mu.Unlock()
	if _, err := fmt.Fprintf(c, "OK %d\n", local); err != nil {
		return
	}
	h(c)
}

// readConnect reads the command byte by byte, as CH does, so nothing the
// host sends after it is consumed.
func readConnect(c net.Conn) (uint32, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) <= maxCommandLen {
		if _, err := c.Read(b); err != nil {
			return 0, fmt.Errorf("reading command: %w", err)
		}
		if b[0] == '\n' {
			word, arg, ok := bytes.Cut(line, []byte(" "))
			if !ok || !bytes.EqualFold(word, []byte("CONNECT")) {
				return 0, fmt.Errorf("%w: %q", errBadCommand, line)
			}
			port, err := strconv.ParseUint(string(arg), 10, 32)
			if err != nil {
				return 0, fmt.Errorf("%w: %q", errBadCommand, line)
			}
			return uint32(port), nil
		}
		line = append(line, b[0])
	}
	return 0, fmt.Errorf("%w: longer than %d bytes", errBadCommand, maxCommandLen)
}

// close stops the device: the listener goes (and with it the socket file,
// as CH removes it at device shutdown) and every guest connection drops.
func (m *muxer) close() {
	m.mu.Lock()
	m.closed = true
	m.ln.Close()
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.wg.Wait()
}
