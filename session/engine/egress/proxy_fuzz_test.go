package egress

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// scriptConn is a guest connection to the egress proxy that sends a fixed
// request, then ends; what the proxy writes is kept.
type scriptConn struct {
	r   io.Reader
	out bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)        { return c.out.Write(p) }
func (c *scriptConn) Close() error                       { return nil }
func (c *scriptConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(t time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzEgressRequest sends arbitrary bytes to a session's egress proxy as
// the guest's client would (the request or CONNECT line and headers are
// what the proxy parses). The sessions' policies admit no destination the
// fuzzer can name: none at all, or only names that resolve to reserved
// addresses the policy does not name. Property: the proxy never resolves
// a name the policy refuses, never connects anywhere, and answers every
// request it read with exactly one well-formed HTTP error (400, 403, or
// 502 for the guest's own loopback, which needs a VM): a status line and
// the headers it sets and no others (nothing of the guest's text breaks
// out of its reason phrase or header), a body of the length it declares,
// then the end.
func FuzzEgressRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://pkgs.test/x HTTP/1.1\r\nHost: pkgs.test\r\n\r\n",
		"CONNECT pkgs.test:443 HTTP/1.1\r\nHost: pkgs.test:443\r\n\r\n",
		"CONNECT [::1]:22 HTTP/1.1\r\n\r\n",
		"GET http://169.254.169.254/latest HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://host.berth.internal:2222/ HTTP/1.1\r\n\r\n",
		"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET ftp://pkgs.test/ HTTP/1.1\r\n\r\n",
		"POST http://a.allowed.test:8080/p HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
		"GET http://localhost/ HTTP/1.0\r\n\r\n",
		"CONNECT a.allowed.test%0d%0aX-Evil:%201 HTTP/1.1\r\n\r\n",
		"GET http://[fe80::1%25eth0]:80/ HTTP/1.1\r\n\r\n",
		"GARBAGE\r\n\r\n",
		"",
		"GET http://x/ HTTP/1.1\r\nHost: " + strings.Repeat("h", 70000) + "\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(0))
	}
	var resolved atomic.Int64
	policies := []string{"none", "allow:*.allowed.test,pkgs.test", "allow:pkgs.test:8080"}
	sessions := make([]*testSess, len(policies))
	for i, p := range policies {
		sessions[i] = newTestSess(f, p, Config{Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			resolved.Add(1)
			// Reserved addresses no policy here names.
			return []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("127.0.0.9")}, nil
		}})
	}
	f.Fuzz(func(t *testing.T, req []byte, which uint8) {
		s := sessions[int(which)%len(sessions)]
		pol := s.Policy()
		before := resolved.Load()
		c := &scriptConn{r: bytes.NewReader(req)}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.serve(context.Background(), c)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("the proxy did not answer %q within 20s", req)
		}
		if n := resolved.Load() - before; n > 0 {
			// Only a name the policy allows is resolved.
			r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req)))
			if err != nil {
				t.Fatalf("resolved a name for an unreadable request %q", req)
			}
			host := r.Host
			if r.Method != http.MethodConnect && r.URL.IsAbs() {
				host = r.URL.Host
			}
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
			if !pol.AllowsName(host, 0) {
				t.Fatalf("policy %s: %q was resolved for %q", pol, host, req)
			}
		}
		out := c.out.Bytes()
		if len(out) == 0 {
			// Only a request that ended before it began goes unanswered.
			if _, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req))); err != io.EOF {
				t.Fatalf("no answer to %q (%v)", req, err)
			}
			return
		}
		checkProxyReply(t, req, out)
	})
}

// checkProxyReply checks that out is one error response of the proxy's.
func checkProxyReply(t *testing.T, req, out []byte) {
	t.Helper()
	// The status line and headers by hand: a reason phrase or header
	// value the guest's text broke out of shows as an extra line.
	head, body, ok := bytes.Cut(out, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("answer to %q has no end of header: %q", req, out)
	}
	lines := strings.Split(string(head), "\r\n")
	status := strings.SplitN(lines[0], " ", 3)
	if len(status) != 3 || status[0] != "HTTP/1.1" {
		t.Fatalf("answer to %q: status line %q", req, lines[0])
	}
	code, _ := strconv.Atoi(status[1])
	switch code {
	case http.StatusBadRequest, http.StatusForbidden:
	case http.StatusBadGateway:
		// Only for what needs no connection: the guest's own loopback
		// (which needs a VM), or a target that is no host and port
		// (answered 502 by design, see TestEgressBadInput).
		if !strings.Contains(status[2], "has no VM") && !strings.Contains(status[2], "egress failed: bad port in") &&
			!strings.Contains(status[2], "egress failed: bad target") {
			t.Fatalf("answer to %q: 502 %q; want one only for the guest's own loopback or a malformed target", req, status[2])
		}
	default:
		t.Fatalf("answer to %q: status %q; the policy allows nothing reachable", req, lines[0])
	}
	want := map[string]bool{"Content-Type": true, "Content-Length": true, "Connection": true, "X-Berth-Error": true}
	got := map[string]string{}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ": ")
		if !ok || !want[k] || got[k] != "" {
			t.Fatalf("answer to %q: header line %q (the guest's text broke out?)", req, l)
		}
		got[k] = v
	}
	if len(got) != len(want) {
		t.Fatalf("answer to %q: headers %v", req, got)
	}
	if got["X-Berth-Error"] != status[2] {
		t.Fatalf("answer to %q: X-Berth-Error %q, reason %q", req, got["X-Berth-Error"], status[2])
	}
	for _, r := range status[2] {
		if r < 0x20 || r == 0x7f {
			t.Fatalf("answer to %q: control character %q in the reason", req, r)
		}
	}
	n, err := strconv.Atoi(got["Content-Length"])
	if err != nil || n != len(body) {
		t.Fatalf("answer to %q: Content-Length %q, body of %d bytes", req, got["Content-Length"], len(body))
	}
	// And a client reads it as such.
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
	if err != nil {
		t.Fatalf("answer to %q unreadable: %v", req, err)
	}
	if resp.StatusCode != code {
		t.Fatalf("answer to %q: client reads %d, line says %d", req, resp.StatusCode, code)
	}
}
