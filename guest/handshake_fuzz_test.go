package guest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzHostHandshake plays a guest whose channel holds arbitrary bytes
// (an earlier connection's leftovers, a hostile agent) before its real
// ACK. Property: the host's handshake succeeds as soon as the ACK with its
// own nonce arrives, whatever precedes it on the same line or before,
// answers with READY carrying that nonce, and hands over exactly the bytes
// that followed the ACK line: not one lost or invented. Garbage alone,
// without the ACK, never completes a handshake.
func FuzzHostHandshake(f *testing.F) {
	f.Add([]byte(""), []byte(""), true)
	f.Add([]byte("BERTH-ACK 1 0123456789abcdef0123456789abcdef\n"), []byte("yamux"), true)
	f.Add(bytes.Repeat([]byte{0, 0xff, '\n', 'B'}, 300), []byte("\x00\x01"), true)
	f.Add([]byte("BERTH-ACK 2 x\nBERTH-ACK "), []byte("rest\n"), true)
	f.Add([]byte("BERTH-SYNC 1 y\nBERTH-READY y\n"), []byte{}, false)
	f.Add([]byte(strings.Repeat("z", 300)), []byte("BERTH-ACK 1 z\n"), true)
	f.Fuzz(func(t *testing.T, garbage, tail []byte, ack bool) {
		if len(garbage) > 64<<10 || len(tail) > 64<<10 {
			return
		}
		host, guest := net.Pipe()
		defer host.Close()
		defer guest.Close()

		// The guest reads the host's first SYNC for its nonce, then keeps
		// draining what the host writes (SYNC repeats, READY).
		var (
			mu      sync.Mutex
			fromHst bytes.Buffer
		)
		nonce := make(chan string, 1)
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			br := bufio.NewReader(guest)
			sent := false
			for {
				line, err := br.ReadString('\n')
				mu.Lock()
				fromHst.WriteString(line)
				mu.Unlock()
				if err != nil {
					return
				}
				if rest, ok := strings.CutPrefix(line, lineSync); ok && !sent {
					f := strings.Fields(rest)
					if len(f) == 2 {
						nonce <- f[1]
						sent = true
					}
				}
			}
		}()
		wrote := make(chan error, 1)
		go func() {
			var n string
			select {
			case n = <-nonce:
			case <-time.After(10 * time.Second):
				wrote <- errors.New("no SYNC from the host")
				return
			}
			msg := append([]byte(nil), garbage...)
			if ack {
				msg = append(msg, lineAck+"1 "+n+"\n"...)
			}
			msg = append(msg, tail...)
			_, err := guest.Write(msg)
			if !ack && err == nil {
				guest.Close() // the stream ends without an answer
			}
			wrote <- err
		}()

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := HostHandshake(ctx, host)
		if !ack {
			if err == nil {
				t.Fatalf("a handshake completed without the guest's ACK (garbage %q)", garbage)
			}
			return
		}
		if err != nil {
			t.Fatalf("handshake failed with garbage %q before the ACK: %v", garbage, err)
		}
		// The guest's write completes only once the host has read it all
		// (net.Pipe does not buffer), so read the tail concurrently.
		got := make([]byte, len(tail))
		readErr := make(chan error, 1)
		go func() {
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err := io.ReadFull(conn, got)
			readErr <- err
		}()
		if err := <-wrote; err != nil {
			t.Fatalf("guest write: %v", err)
		}
		if err := <-readErr; err != nil {
			t.Fatalf("reading the %d bytes after the ACK: %v", len(tail), err)
		}
		if !bytes.Equal(got, tail) {
			t.Fatalf("after the handshake the stream holds %q, want %q", got, tail)
		}
		host.Close()
		<-drained
		mu.Lock()
		defer mu.Unlock()
		n := ""
		if i := strings.Index(fromHst.String(), lineSync); i >= 0 {
			if f := strings.Fields(fromHst.String()[i+len(lineSync):]); len(f) >= 2 {
				n = f[1]
			}
		}
		if !strings.HasSuffix(fromHst.String(), lineReady+n+"\n") {
			t.Fatalf("the host's last line is not READY with its nonce: %q", tailOf(fromHst.String()))
		}
	})
}

// FuzzGuestHandshake feeds the agent's side arbitrary bytes from the host
// channel. Property: it answers only in well-formed lines (ACK with a
// nonce a SYNC carried, PONG with a PING's text, BULK with exactly its
// zeros); it returns only once a READY line carries the nonce of the last
// SYNC it acknowledged, leaving every byte after that line unread for
// yamux; otherwise it ends with the stream's own error.
func FuzzGuestHandshake(f *testing.F) {
	f.Add([]byte("BERTH-SYNC 1 abc\nBERTH-READY abc\nyamux"))
	f.Add([]byte("junk\x00BERTH-SYNC 1 abc\nBERTH-SYNC 1 abc\nBERTH-READY abd\nBERTH-READY abc\n"))
	f.Add([]byte("BERTH-PING n1\nBERTH-BULK n2 10\nBERTH-SYNC 1 q\nBERTH-READY q\n\x00\x00"))
	f.Add([]byte("BERTH-READY abc\nBERTH-SYNC x y\n"))
	f.Add([]byte("BERTH-BULK n -5\nBERTH-BULK n 99999999999\n"))
	f.Add([]byte("BERTH-SINK s 5\nabcdeBERTH-SINK t 3\nBERTH-SYNC 1 q\nBERTH-READY q\n"))
	f.Add([]byte("BERTH-SINK s 40\nBERTH-SYNC 1 q\nBERTH-READY q\n"))
	f.Add([]byte(strings.Repeat("x", 400) + "BERTH-SYNC 1 " + strings.Repeat("n", 200) + "\nBERTH-READY " + strings.Repeat("n", 200) + "\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out := &limitedBuffer{max: 1 << 20}
		br := bufio.NewReader(bytes.NewReader(in))
		r, err := GuestHandshake(out, br)
		if out.over {
			return // a BULK beyond the test's buffer: the write failed, as on a closed port
		}
		acked := checkAgentLines(t, in, out.Bytes())
		if err != nil {
			if err != io.EOF {
				t.Fatalf("handshake ended with %v, want io.EOF (the input's end)", err)
			}
			return
		}
		rest, _ := io.ReadAll(r)
		if !bytes.HasSuffix(in, rest) {
			t.Fatalf("after the handshake the stream holds %q, which is not the input's tail", tailOf(string(rest)))
		}
		read := in[:len(in)-len(rest)]
		if acked == "" || !bytes.HasSuffix(read, []byte(lineReady+acked+"\n")) {
			t.Fatalf("handshake returned after %q; want it right after READY with the last ACKed nonce %q", tailOf(string(read)), acked)
		}
	})
}

// checkAgentLines checks what the agent wrote and returns the nonce of its
// last ACK.
func checkAgentLines(t *testing.T, in, out []byte) string {
	t.Helper()
	last := ""
	for len(out) > 0 {
		i := bytes.IndexByte(out, '\n')
		if i < 0 {
			t.Fatalf("the agent wrote an unterminated line %q", tailOf(string(out)))
		}
		line := string(out[:i])
		out = out[i+1:]
		switch {
		case strings.HasPrefix(line, lineAck):
			n, ok := strings.CutPrefix(line, lineAck+"1 ")
			// The nonce is the SYNC's as fmt reads it (invalid UTF-8
			// becomes U+FFFD, which no host nonce holds).
			if !ok || n == "" || strings.ContainsAny(n, " \n") {
				t.Fatalf("malformed ACK %q", line)
			}
			if !bytes.Contains(in, []byte(lineSync)) {
				t.Fatalf("ACK %q without a SYNC", line)
			}
			last = n
		case strings.HasPrefix(line, linePong):
			if !bytes.Contains(in, []byte(linePing+strings.TrimPrefix(line, linePong)+"\n")) {
				t.Fatalf("PONG %q answers no PING", line)
			}
		case strings.HasPrefix(line, lineBulk):
			f := strings.Fields(strings.TrimPrefix(line, lineBulk))
			if len(f) != 2 {
				t.Fatalf("malformed BULK %q", line)
			}
			size, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || size < 0 || size > int64(len(out)) {
				t.Fatalf("BULK %q with %d bytes after it", line, len(out))
			}
			if bytes.ContainsFunc(out[:size], func(r rune) bool { return r != 0 }) {
				t.Fatalf("BULK %q carries non-zero bytes", line)
			}
			out = out[size:]
		case strings.HasPrefix(line, lineSink):
			f := strings.Fields(strings.TrimPrefix(line, lineSink))
			if len(f) != 2 || !bytes.Contains(in, []byte(lineSink)) {
				t.Fatalf("malformed or unasked SINK answer %q", line)
			}
			if size, err := strconv.ParseInt(f[1], 10, 64); err != nil || size < 0 || size > int64(len(in)) {
				t.Fatalf("SINK answer %q for more bytes than the input holds", line)
			}
		default:
			t.Fatalf("the agent wrote %q", line)
		}
	}
	return last
}

// limitedBuffer fails writes past max bytes, as a port that went away.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		b.over = true
		return 0, errors.New("test buffer full")
	}
	return b.Buffer.Write(p)
}

func tailOf(s string) string {
	if len(s) > 200 {
		return "…" + s[len(s)-200:]
	}
	return s
}
