package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// egressSess is session s1 with policy and the test names pinned.
func egressSess(t *testing.T, policy string, nc Config) *testSess {
	t.Helper()
	if nc.Resolve == nil {
		nc.Resolve = pinned
	}
	return newTestSess(t, policy, nc)
}

// proxyConn connects a client to the session's egress proxy as the agent
// would: one connection per guest connection.
func proxyConn(t *testing.T, s *testSess) net.Conn {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() { s.serve(context.Background(), b); close(done) }()
	t.Cleanup(func() { a.Close(); <-done })
	a.SetDeadline(time.Now().Add(10 * time.Second))
	return a
}

func TestEgressProxy(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s %s", r.Method, r.URL.Path)
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	p := strconv.Itoa(port)
	for _, tc := range []struct {
		policy, url string
		connect     bool
		status      int
		body        string // substring
	}{
		{"none", "http://pkgs.test:" + p + "/x", false, 403, "berth: egress to pkgs.test:" + p + " is not allowed for session s1 (policy: none)"},
		{"allow:127.0.0.1:" + p + ",pkgs.test", "http://pkgs.test:" + p + "/x", false, 200, "hello GET /x"},
		{"allow:127.0.0.1:" + p + ",pkgs.test", "http://pkgs.test:1/x", false, 403, "policy: allow:127.0.0.1:" + p},
		{"allow:host.berth.internal:" + p, "http://host.berth.internal:" + p + "/h", false, 200, "hello GET /h"},
		{"allow:host.berth.internal:" + p, "host.berth.internal:" + p, true, 200, "hello GET /t"},
		{"open", "http://host.berth.internal:" + p + "/x", false, 403, "egress to host.berth.internal:" + p},
		{"open", "http://169.254.169.254/latest/meta-data", false, 403, "egress to 169.254.169.254:80"},
		{"open", "http://ten.test/", false, 403, "egress to ten.test:80 is not allowed for session s1: ten.test resolves to 10.0.0.1, a reserved address (10.0.0.0/8); naming 10.0.0.1 or 10.0.0.0/8 in the policy allows it"},
		{"open", "http://10.1.2.3:8080/", false, 403, "egress to 10.1.2.3:8080 is not allowed for session s1: 10.1.2.3 is a reserved address (10.0.0.0/8); naming 10.1.2.3 or 10.0.0.0/8 in the policy allows it (policy: open)"},
		{"open", "ten.test:443", true, 403, "egress to ten.test:443 is not allowed for session s1: ten.test resolves to 10.0.0.1, a reserved address (10.0.0.0/8); naming 10.0.0.1 or 10.0.0.0/8 in the policy allows it (policy: open)"},
		{"allow:pkgs.test", "http://pkgs.test:" + p + "/x", false, 403, "egress to pkgs.test:" + p},
		{"allow:pkgs.test,127.0.0.1", "http://pkgs.test:" + p + "/x", false, 200, "hello GET /x"},
		{"allow:pkgs.test,127.0.0.1", "pkgs.test:" + p, true, 200, "hello GET /t"},
		{"allow:other.test", "http://pkgs.test:" + p + "/x", false, 403, "policy: allow:other.test"},
		// Loopback as written is the guest's own (here: no VM to reach).
		{"open:127.0.0.1", "http://127.0.0.1:" + p + "/x", false, 502, "has no VM"},
		{"allow:127.0.0.1", "http://localhost:" + p + "/x", false, 502, "has no VM"},
		{"open", "[::1]:" + p, true, 502, "has no VM"},
		{"open", "http://nowhere.test/", false, 502, "cannot resolve nowhere.test"},
	} {
		t.Run(tc.policy+" "+tc.url, func(t *testing.T) {
			s := egressSess(t, tc.policy, Config{})
			c := proxyConn(t, s)
			br := bufio.NewReader(c)
			if tc.connect {
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", tc.url, tc.url)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tc.status {
					t.Fatalf("CONNECT: %s, want %d", resp.Status, tc.status)
				}
				if tc.status != 200 {
					b, _ := io.ReadAll(resp.Body)
					if !strings.Contains(string(b), tc.body) || tc.status == 403 && !strings.Contains(resp.Status, tc.body) {
						t.Fatalf("CONNECT refused with %q / %q, want %q in both", resp.Status, b, tc.body)
					}
					return
				}
				fmt.Fprintf(c, "GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			} else {
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n", tc.url)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.body) {
				t.Fatalf("got %s %q, want %d with %q", resp.Status, b, tc.status, tc.body)
			}
			wantRefused := int64(0)
			if tc.status == 403 {
				wantRefused = 1
			}
			if got := s.c.Refused.Load(); got != wantRefused {
				t.Errorf("refusals counted %d, want %d", got, wantRefused)
			}
		})
	}
}

func TestEgressBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, send string
		status     int
	}{
		{"garbage", "\x00\x01\x02 garbage\r\n\r\n", 400},
		{"origin form", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"huge header", "GET http://a.test/ HTTP/1.1\r\nX: " + strings.Repeat("a", 100<<10) + "\r\n\r\n", 400},
		{"https url in plain request", "GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", 400},
		{"bad connect target", "CONNECT a.test:99999 HTTP/1.1\r\nHost: a.test:99999\r\n\r\n", 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := egressSess(t, "open", Config{})
			c := proxyConn(t, s)
			go io.WriteString(c, tc.send)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("X-Berth-Error"), "berth: ") {
				t.Fatalf("got %s (%q), want %d with a berth message", resp.Status, resp.Header.Get("X-Berth-Error"), tc.status)
			}
		})
	}
}

func TestEgressBoundsConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	target := "pkgs.test:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	s := egressSess(t, "allow:127.0.0.1,pkgs.test", Config{MaxConns: 2})
	var held []net.Conn
	for range 2 {
		c := proxyConn(t, s)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("tunnel: %v %v", resp, err)
		}
		held = append(held, c)
	}
	c := proxyConn(t, s)
	go fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 503 || !strings.Contains(resp.Status, "net_max_conns") {
		t.Fatalf("third connection: %v %v, want 503 naming net_max_conns", resp, err)
	}
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for s.c.Conns.Load() > 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	c = proxyConn(t, s)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after one closed: %v %v, want a tunnel", resp, err)
	}
	rx, tx := s.c.RX.Load(), s.c.TX.Load()
	io.WriteString(c, "ping")
	b := make([]byte, 4)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through the tunnel: %q %v", b, err)
	}
	// The bytes are counted for the session's figures (stats, /metrics);
	// a write is counted once it returns, which may be after its echo.
	for deadline := time.Now().Add(5 * time.Second); s.c.TX.Load()-tx < 4 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := s.c.TX.Load() - tx; got != 4 {
		t.Errorf("%d bytes counted sent, want 4", got)
	}
	if got := s.c.RX.Load() - rx; got != 4 {
		t.Errorf("%d bytes counted received, want 4", got)
	}
}

func TestEgressForbiddenPortAndRefusalNotes(t *testing.T) {
	s := egressSess(t, "allow:127.0.0.1,pkgs.test,host.berth.internal", Config{Forbidden: []int{2222}})
	for range 5 {
		c := proxyConn(t, s)
		fmt.Fprintf(c, "CONNECT host.berth.internal:2222 HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 403 {
			t.Fatalf("the SSH port: %v %v, want 403", resp, err)
		}
		c.Close()
	}
	c := proxyConn(t, s)
	fmt.Fprintf(c, "GET http://pkgs.test:2222/ HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 403 {
		t.Fatalf("the SSH port on 127.0.0.1: %v %v, want 403", resp, err)
	}
	// The host's own non-loopback addresses are berth's too.
	var own netip.Addr
	if addrs, _ := net.InterfaceAddrs(); len(addrs) > 0 {
		for _, ia := range addrs {
			if n, ok := ia.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				own, _ = netip.AddrFromSlice(n.IP.To4())
				break
			}
		}
	}
	refusedWant := int64(6)
	if own.IsValid() {
		s2 := egressSess(t, "open:"+own.String(), Config{Forbidden: []int{2222}})
		c := proxyConn(t, s2)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", netip.AddrPortFrom(own, 2222))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 403 {
			t.Fatalf("the SSH port on the host's address %s: %v %v, want 403", own, resp, err)
		}
	}
	if got := s.c.Refused.Load(); got != refusedWant {
		t.Errorf("refused %d, want %d", got, refusedWant)
	}
	if notes := s.Notes(); len(notes) != 1 || !strings.Contains(notes[0], "egress to host.berth.internal:2222 is not allowed") {
		t.Errorf("notes %q, want one rate-limited note", notes)
	}
}

// dnsQuery builds a query for name of type qtype.
func dnsQuery(name string, qtype uint16) []byte {
	q := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(name, ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	q = append(q, 0)
	q = binary.BigEndian.AppendUint16(q, qtype)
	return binary.BigEndian.AppendUint16(q, 1)
}

func TestDNSAnswers(t *testing.T) {
	for _, tc := range []struct {
		policy, name string
		qtype        uint16
		rcode        int
		answers      int
	}{
		{"allow:pkgs.test,127.0.0.1", "pkgs.test", dnsTypeA, rcodeOK, 1},
		{"allow:pkgs.test,127.0.0.1", "PKGS.test", dnsTypeA, rcodeOK, 1},
		{"allow:pkgs.test,127.0.0.1", "pkgs.test", dnsTypeAAAA, rcodeOK, 0},
		{"allow:pkgs.test", "pkgs.test", dnsTypeA, rcodeOK, 0}, // resolves to loopback: not given out
		{"allow:pkgs.test", "other.test", dnsTypeA, rcodeRefused, 0},
		{"none", "pkgs.test", dnsTypeA, rcodeRefused, 0},
		{"open", "ten.test", dnsTypeA, rcodeOK, 0},
		{"open", "nowhere.test", dnsTypeA, rcodeNXDomain, 0},
		{"open:host.berth.internal", "host.berth.internal", dnsTypeA, rcodeRefused, 0},
	} {
		s := egressSess(t, tc.policy, Config{})
		r := s.answer(context.Background(), dnsQuery(tc.name, tc.qtype))
		if len(r) < 12 || r[0] != 0x12 || r[1] != 0x34 || r[2]&0x80 == 0 {
			t.Fatalf("%s %s: reply %x is no answer to the query", tc.policy, tc.name, r)
		}
		if rc, an := int(r[3]&0x0f), int(binary.BigEndian.Uint16(r[6:])); rc != tc.rcode || an != tc.answers {
			t.Errorf("%s %s type %d: rcode %d with %d answers, want %d with %d", tc.policy, tc.name, tc.qtype, rc, an, tc.rcode, tc.answers)
		}
		if tc.answers == 1 && !strings.HasSuffix(string(r), "\x00\x04\x7f\x00\x00\x01") {
			t.Errorf("%s: answer %x does not end in 127.0.0.1", tc.name, r)
		}
	}
	s := egressSess(t, "open", Config{})
	for _, bad := range [][]byte{{1, 2, 3}, append(dnsQuery("a.test", 1)[:14], 0xff)} {
		r := s.answer(context.Background(), bad)
		if len(bad) >= 12 && (len(r) != 12 || r[3]&0x0f != rcodeFormErr) {
			t.Errorf("malformed %x: reply %x, want FORMERR", bad, r)
		}
	}
}

// Plain HTTP responses pass on whole: a chunked body arrives delimited by
// the close, a HEAD keeps its length and sends no body, a 100 Continue
// precedes the answer.
func TestEgressResponses(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			for i := range 3 {
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/post":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "got %d bytes", len(b))
		default:
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "fixed")
		}
	}))
	defer up.Close()
	p := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	s := egressSess(t, "allow:127.0.0.1:"+p+",pkgs.test", Config{})
	do := func(req string) (*http.Response, string) {
		c := proxyConn(t, s)
		go io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := do("GET http://pkgs.test:" + p + "/chunked HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 || body != "part0;part1;part2;" || !resp.Close {
		t.Errorf("chunked: %s %q close=%v", resp.Status, body, resp.Close)
	}
	if resp, body := do("GET http://pkgs.test:" + p + "/f HTTP/1.1\r\nHost: x\r\n\r\n"); body != "fixed" || resp.ContentLength != 5 {
		t.Errorf("fixed: %q %d", body, resp.ContentLength)
	}
	c := proxyConn(t, s)
	go io.WriteString(c, "HEAD http://pkgs.test:"+p+"/f HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Length") != "5" {
		t.Errorf("HEAD: %v %v", resp, err)
	}
	c = proxyConn(t, s)
	body := strings.Repeat("x", 3000)
	go fmt.Fprintf(c, "POST http://pkgs.test:%s/post HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n%s", p, len(body), body)
	br = bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err == nil && resp.StatusCode == 100 {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST: %v %v", resp, err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "got 3000 bytes" {
		t.Errorf("POST answer %q", b)
	}
}
