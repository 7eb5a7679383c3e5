package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// AgentPort is the vsock port the guest agent listens on.
const AgentPort = 1024

// Defaults for VsockDialer.
const (
	defaultVsockMaxWait = 30 * time.Second
	// Kata waits this long for the OK line because a guest-kernel race can
	// leave a connection request unanswered; CH itself gives up on a
	// request after 2 s and closes the socket, which ends an attempt sooner.
	defaultHandshakeTimeout = 10 * time.Second
	// CH reads the CONNECT line byte by byte, up to 32 bytes; its OK line
	// ("OK " and a u32) is shorter still.
	maxReplyLen = 32
)

// ErrVsockReply means the hybrid vsock socket answered CONNECT with
// something other than "OK <port>\n". It is not retried: the socket is not
// a CH vsock muxer, or the stream is out of step.
var ErrVsockReply = errors.New("hybrid vsock: unexpected reply to CONNECT")

// VsockDialer connects to a guest port through Cloud Hypervisor's hybrid
// vsock: a unix socket on which the host writes "CONNECT <port>\n" and CH
// answers "OK <host port>\n" once the guest accepted. The zero value uses
// the defaults.
type VsockDialer struct {
	// MaxWait bounds the whole dial, retries included, on top of the
	// context. Zero means 30 s.
	MaxWait time.Duration
	// HandshakeTimeout bounds one attempt's wait for the OK line. Zero
	// means 10 s.
	HandshakeTimeout time.Duration
}

// Dial connects to port through the hybrid vsock socket at path and
// returns the raw byte stream after the OK line.
//
// While the guest is not listening yet CH closes the connection without a
// word, and before the VMM has created the socket there is nothing to
// connect to; both are retried until ctx ends or MaxWait passes. A reply
// other than OK fails at once with ErrVsockReply.
func (d VsockDialer) Dial(ctx context.Context, path string, port uint32) (net.Conn, error) {
	maxWait := cmpOr(d.MaxWait, defaultVsockMaxWait)
	hsTimeout := cmpOr(d.HandshakeTimeout, defaultHandshakeTimeout)
	ctx, cancel := context.WithTimeoutCause(ctx, maxWait,
		fmt.Errorf("gave up after %s: %w", maxWait, context.DeadlineExceeded))
	defer cancel()

	var lastErr error
	delay := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		conn, err := dialVsockOnce(ctx, path, port, hsTimeout)
		if err == nil {
			return conn, nil
		}
		if !retryable(err) {
			return nil, fmt.Errorf("vsock %s port %d: %w", path, port, err)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("vsock %s port %d: nothing accepted the connection in %d attempts "+
				"(is the guest agent up? see the console log): %w (last attempt: %w)",
				path, port, attempt, context.Cause(ctx), lastErr)
		case <-time.After(delay):
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// errNotListening is an attempt CH ended without a reply, which is how it
// says nothing in the guest accepted the port.
var errNotListening = errors.New("connection closed before OK: guest not listening")

// retryable tells the errors that mean "not yet" from the ones that will
// not go away by waiting.
func retryable(err error) bool {
	switch {
	case errors.Is(err, errNotListening),
		errors.Is(err, os.ErrDeadlineExceeded), // OK line did not come in time
		errors.Is(err, syscall.ENOENT),         // VMM has not created the socket yet
		errors.Is(err, syscall.ECONNREFUSED),   // stale socket, or VMM not serving yet
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE):
		return true
	}
	return false
}

func dialVsockOnce(ctx context.Context, path string, port uint32, hsTimeout time.Duration) (_ net.Conn, err error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	// The deadline bounds this attempt; AfterFunc makes ctx's end (the
	// caller giving up, or the VMM exiting) interrupt a blocked read.
	if err := c.SetDeadline(time.Now().Add(hsTimeout)); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// One write: CH has crashed on a CONNECT line split across reads.
	if _, err := io.WriteString(c, "CONNECT "+strconv.FormatUint(uint64(port), 10)+"\n"); err != nil {
		return nil, err
	}
	if err := readOK(c); err != nil {
		return nil, err
	}
	if !stop() {
		return nil, context.Cause(ctx)
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return c, nil
}

// readOK reads "OK <digits>\n" one byte at a time: a buffered read could
// swallow the first bytes the guest sends after it.
func readOK(r io.Reader) error {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := r.Read(b)
		if n == 1 {
			if b[0] == '\n' {
				if validOKLine(line) {
					return nil
				}
				return fmt.Errorf("%w: %q", ErrVsockReply, line)
			}
			line = append(line, b[0])
			if len(line) > maxReplyLen || !okPrefix(line) {
				return fmt.Errorf("%w: %q", ErrVsockReply, line)
			}
			continue
		}
		if errors.Is(err, io.EOF) {
			return errNotListening
		}
		if err != nil {
			return err
		}
	}
}

// okPrefix reports whether line can still become "OK <digits>".
func okPrefix(line []byte) bool {
	const word = "OK "
	for i, c := range line {
		switch {
		case i < len(word):
			if c != word[i] {
				return false
			}
		case c < '0' || c > '9':
			return false
		}
	}
	return true
}

func validOKLine(line []byte) bool {
	if len(line) <= len("OK ") || !okPrefix(line) {
		return false
	}
	_, err := strconv.ParseUint(string(line[len("OK "):]), 10, 32)
	return err == nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
