package guest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The handshake runs on the raw channel before yamux starts. A virtio-serial
// port keeps bytes from an earlier host connection (measured: megabytes of
// an interrupted transfer arrive on the next connection), so each side
// discards input until it sees the other's line carrying a fresh nonce:
//
//	host  → BERTH-SYNC <version> <nonce>\n    (repeated until answered)
//	guest → BERTH-ACK <version> <nonce>\n
//	host  → BERTH-READY <nonce>\n             (guest discards repeated SYNCs until this)
//
// Before a SYNC, the guest also answers two measuring requests used by the
// benchmarks as the channel's physical limits:
//
//	host  → BERTH-PING <nonce>\n     guest → BERTH-PONG <nonce>\n
//	host  → BERTH-BULK <nonce> <n>\n guest → BERTH-BULK <nonce> <n>\n + n bytes
//	host  → BERTH-SINK <nonce> <n>\n + n bytes   guest → BERTH-SINK <nonce> <n>\n
//
// (BULK measures guest to host, SINK host to guest: the guest answers a
// SINK once it has read all n bytes.)
const (
	lineSync  = "BERTH-SYNC "
	lineAck   = "BERTH-ACK "
	lineReady = "BERTH-READY "
	linePing  = "BERTH-PING "
	linePong  = "BERTH-PONG "
	lineBulk  = "BERTH-BULK "
	lineSink  = "BERTH-SINK "
	maxLine   = 256
)

// syncInterval is how often the host repeats its SYNC while the guest has
// not answered (it may still be booting, or busy noticing the old
// connection ended). The first repeats come faster: after a restore the
// first SYNC usually lands in the guest's old session and is lost, and the
// next one is then what the wake waits for.
const (
	syncInterval      = 25 * time.Millisecond
	syncIntervalFirst = 5 * time.Millisecond
	syncFastRepeats   = 40
)

func newNonce() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// bufferedConn is a net.Conn whose first reads come from a buffer filled
// during the handshake.
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func withBuffered(conn net.Conn, br *bufio.Reader) net.Conn {
	if br.Buffered() == 0 {
		return conn
	}
	rest, _ := br.Peek(br.Buffered())
	return &bufferedConn{Conn: conn, r: io.MultiReader(bytes.NewReader(bytes.Clone(rest)), conn)}
}

// lineScanner finds lines in a byte stream that may hold arbitrary binary
// garbage. A line is what precedes '\n'; it is bounded, and a marker may sit
// after garbage on the same line, so callers search inside it.
type lineScanner struct {
	br   *bufio.Reader
	line []byte
}

func (s *lineScanner) next() ([]byte, error) {
	s.line = s.line[:0]
	for {
		b, err := s.br.ReadByte()
		if err != nil {
			return nil, err
		}
		if b == '\n' {
			return s.line, nil
		}
		if len(s.line) >= maxLine {
			// Keep the tail: a marker can start after long garbage.
			copy(s.line, s.line[len(s.line)-maxLine/2:])
			s.line = s.line[:maxLine/2]
		}
		s.line = append(s.line, b)
	}
}

// field returns the text after marker in line, or false.
func field(line []byte, marker string) (string, bool) {
	i := bytes.LastIndex(line, []byte(marker))
	if i < 0 {
		return "", false
	}
	return string(line[i+len(marker):]), true
}

// HostHandshake runs the host side on a fresh connection and returns the
// connection positioned at the start of the guest's yamux stream.
func HostHandshake(ctx context.Context, conn net.Conn) (net.Conn, error) {
	nonce := newNonce()
	syncLine := []byte(fmt.Sprintf("%s%d %s\n", lineSync, Version, nonce))

	var mu sync.Mutex // serialises writes between the repeater and READY
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(syncIntervalFirst)
		defer t.Stop()
		for n := 0; ; n++ {
			if n == syncFastRepeats {
				t.Reset(syncInterval)
			}
			mu.Lock()
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			_, err := conn.Write(syncLine)
			mu.Unlock()
			if err != nil && !isTimeout(err) {
				return
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	// Reads are bounded by ctx through the deadline.
	if d, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(d)
	}
	unwatch := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer unwatch()

	br := bufio.NewReaderSize(conn, 64<<10)
	sc := &lineScanner{br: br}
	for {
		line, err := sc.next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("agent handshake: %w", ctx.Err())
			}
			return nil, fmt.Errorf("agent handshake: %w", err)
		}
		rest, ok := field(line, lineAck)
		if !ok {
			continue
		}
		var v int
		var got string
		if _, err := fmt.Sscanf(rest, "%d %s", &v, &got); err != nil || got != nonce {
			continue // an answer to an older connection's SYNC
		}
		if v != Version {
			return nil, fmt.Errorf("agent speaks protocol v%d, this berth speaks v%d: rebuild the image with `berth image build`", v, Version)
		}
		break
	}
	close(stop)
	wg.Wait()
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(lineReady + nonce + "\n")); err != nil {
		return nil, fmt.Errorf("agent handshake: %w", err)
	}
	conn.SetWriteDeadline(time.Time{})
	conn.SetReadDeadline(time.Time{})
	return withBuffered(conn, br), nil
}

// isTimeout reports a write that hit its deadline: the guest is not reading
// yet (still booting), which is no reason to give up.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// GuestHandshake runs the agent side: it discards input until a SYNC,
// answers it, and returns once the host's READY arrived, with the
// connection positioned at the start of the host's yamux stream. It also
// answers PING and BULK. read errors are returned as they are, so the caller
// can tell a disconnected port (io.EOF) and retry.
func GuestHandshake(conn io.ReadWriter, br *bufio.Reader) (io.Reader, error) {
	sc := &lineScanner{br: br}
	nonce := ""
	for {
		line, err := sc.next()
		if err != nil {
			return nil, err
		}
		if rest, ok := field(line, lineSync); ok {
			var v int
			var n string
			if _, err := fmt.Sscanf(rest, "%d %s", &v, &n); err != nil {
				continue
			}
			if n == nonce {
				continue // a repeat of the SYNC already answered
			}
			nonce = n
			if _, err := fmt.Fprintf(conn, "%s%d %s\n", lineAck, Version, nonce); err != nil {
				return nil, err
			}
			continue
		}
		if rest, ok := field(line, lineReady); ok && nonce != "" && rest == nonce {
			return br, nil
		}
		if rest, ok := field(line, linePing); ok {
			if _, err := io.WriteString(conn, linePong+rest+"\n"); err != nil {
				return nil, err
			}
			continue
		}
		if rest, ok := field(line, lineBulk); ok {
			var n string
			var size int64
			if _, err := fmt.Sscanf(rest, "%s %d", &n, &size); err != nil || size < 0 || size > 1<<34 {
				continue
			}
			if _, err := fmt.Fprintf(conn, "%s%s %d\n", lineBulk, n, size); err != nil {
				return nil, err
			}
			if err := writeZeros(conn, size); err != nil {
				return nil, err
			}
			continue
		}
		if rest, ok := field(line, lineSink); ok {
			var n string
			var size int64
			if _, err := fmt.Sscanf(rest, "%s %d", &n, &size); err != nil || size < 0 || size > 1<<34 {
				continue
			}
			// Read as yamux would: through br, whatever the kernel hands
			// over per read.
			if _, err := io.CopyN(io.Discard, br, size); err != nil {
				return nil, err
			}
			if _, err := fmt.Fprintf(conn, "%s%s %d\n", lineSink, n, size); err != nil {
				return nil, err
			}
		}
	}
}

func writeZeros(w io.Writer, n int64) error { return writeZerosSize(w, n, 256<<10) }

func writeZerosSize(w io.Writer, n int64, size int) error {
	zeros := make([]byte, max(size, 1))
	for n > 0 {
		chunk := int64(len(zeros))
		if n < chunk {
			chunk = n
		}
		if _, err := w.Write(zeros[:chunk]); err != nil {
			return err
		}
		n -= chunk
	}
	return nil
}

// RawPing measures one round trip on a raw channel before the handshake.
// The first ping after a host reconnect can be eaten by the agent while it
// notices the old session ended, so unanswered pings are repeated; the
// returned time is that of the ping that was answered.
func RawPing(ctx context.Context, conn net.Conn, br *bufio.Reader) (time.Duration, error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	sc := &lineScanner{br: br}
	for {
		nonce := newNonce()
		start := time.Now()
		if _, err := io.WriteString(conn, linePing+nonce+"\n"); err != nil {
			return 0, err
		}
		conn.SetReadDeadline(time.Now().Add(time.Second))
		for {
			line, err := sc.next()
			if err != nil {
				if isTimeout(err) && ctx.Err() == nil {
					break // resend
				}
				return 0, err
			}
			if rest, ok := field(line, linePong); ok && rest == nonce {
				conn.SetReadDeadline(time.Time{})
				if d, ok := ctx.Deadline(); ok {
					conn.SetDeadline(d)
				}
				return time.Since(start), nil
			}
		}
	}
}

// RawBulk asks the guest for n bytes on the raw channel and returns how long
// they took to arrive.
func RawBulk(ctx context.Context, conn net.Conn, br *bufio.Reader, n int64) (time.Duration, error) {
	if _, err := RawPing(ctx, conn, br); err != nil { // the agent is listening
		return 0, err
	}
	nonce := newNonce()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "%s%s %d\n", lineBulk, nonce, n); err != nil {
		return 0, err
	}
	if err := awaitLine(br, lineBulk, fmt.Sprintf("%s %d", nonce, n)); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(io.Discard, br, n); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// RawSink sends n bytes to the guest on the raw channel, written wsize
// bytes at a time, and returns how long they took until the guest said it
// had read them all: the host-to-guest limit of the channel.
func RawSink(ctx context.Context, conn net.Conn, br *bufio.Reader, n int64, wsize int) (time.Duration, error) {
	if _, err := RawPing(ctx, conn, br); err != nil { // the agent is listening
		return 0, err
	}
	nonce := newNonce()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "%s%s %d\n", lineSink, nonce, n); err != nil {
		return 0, err
	}
	if err := writeZerosSize(conn, n, wsize); err != nil {
		return 0, err
	}
	if err := awaitLine(br, lineSink, fmt.Sprintf("%s %d", nonce, n)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// awaitLine reads lines until one is kind followed by want, skipping
// what an earlier exchange left on the channel.
func awaitLine(br *bufio.Reader, kind, want string) error {
	sc := &lineScanner{br: br}
	for {
		line, err := sc.next()
		if err != nil {
			return err
		}
		if rest, ok := field(line, kind); ok && rest == want {
			return nil
		}
	}
}
