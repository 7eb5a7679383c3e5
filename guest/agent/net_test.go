package agent

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

func freeAddr(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		return pc.LocalAddr().String()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// netAgent starts an agent with its proxy and DNS server on free loopback
// ports, connected to a host client whose incoming streams go to handle.
func netAgent(t *testing.T, handle func(context.Context, *guest.Incoming)) (*Agent, *guest.Client) {
	t.Helper()
	a, err := New(Config{Workspace: t.TempDir(), Proxy: freeAddr(t, "tcp"), DNS: freeAddr(t, "udp")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.ServeNet(ctx) }()
	c := dial(t, a)
	done := make(chan struct{})
	go func() { c.ServeIncoming(ctx, handle); close(done) }()
	t.Cleanup(func() { cancel(); c.Close(); <-done; <-served })
	// The agent has the host once its session is current, and the
	// listeners are up once the proxy accepts.
	for i := 0; a.hostSession() == nil; i++ {
		if i > 500 {
			t.Fatal("the agent never saw the host connection")
		}
		time.Sleep(2 * time.Millisecond)
	}
	for i := 0; ; i++ {
		conn, err := net.Dial("tcp", a.cfg.Proxy)
		if err == nil {
			conn.Close()
			break
		}
		if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return a, c
}

func TestProxyAndDNSReachTheHost(t *testing.T) {
	var overTCP atomic.Bool
	a, _ := netAgent(t, func(ctx context.Context, in *guest.Incoming) {
		switch in.Req.Op {
		case guest.OpEgress:
			req, err := http.ReadRequest(bufio.NewReader(in.Conn))
			if err != nil {
				in.Conn.Close()
				return
			}
			io.WriteString(in.Conn, "HTTP/1.1 403 berth: no\r\nContent-Length: 3\r\n\r\n"+req.URL.Host[:3])
			in.Conn.Close()
		case guest.OpDNS:
			overTCP.Store(in.Req.TCP)
			r := append([]byte(nil), in.Req.Data...)
			r[2] |= 0x80
			in.Reply(guest.DNSReply{Data: r})
		}
	})
	c, err := net.Dial("tcp", a.cfg.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || string(b) != "exa" {
		t.Fatalf("through the proxy: %s %q", resp.Status, b)
	}
	u, err := net.Dial("udp", a.cfg.DNS)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	q := []byte{0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 1, 0, 1}
	u.Write(q)
	u.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := u.Read(buf)
	if err != nil || n != len(q) || buf[0] != 0xab || buf[2]&0x80 == 0 || overTCP.Load() {
		t.Fatalf("dns reply %x %v (asked the host as tcp: %v)", buf[:n], err, overTCP.Load())
	}
	// Over TCP, as a resolver asks again after a reply with the TC bit:
	// two queries on one connection, each framed by its length.
	var tc net.Conn
	for i := 0; ; i++ {
		if tc, err = net.Dial("tcp", a.cfg.DNS); err == nil {
			break
		}
		if i > 200 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	for range 2 {
		tc.Write(append([]byte{0, byte(len(q))}, q...))
		got := make([]byte, 2+len(q))
		if _, err := io.ReadFull(tc, got); err != nil || got[1] != byte(len(q)) || got[2] != 0xab || got[4]&0x80 == 0 || !overTCP.Load() {
			t.Fatalf("dns over tcp: %x %v (asked the host as tcp: %v)", got, err, overTCP.Load())
		}
	}
}

func TestProxyWithoutHostRefusesVisibly(t *testing.T) {
	a, err := New(Config{Workspace: t.TempDir(), Proxy: freeAddr(t, "tcp")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.ServeNet(ctx)
	var c net.Conn
	for i := 0; i < 200; i++ {
		if c, err = net.Dial("tcp", a.cfg.Proxy); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT a.test:443 HTTP/1.1\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 503 || !strings.Contains(resp.Status, "host is not connected") {
		t.Fatalf("no host: %v %v", resp, err)
	}
}

func TestDialGuestAndPorts(t *testing.T) {
	_, c := netAgent(t, func(ctx context.Context, in *guest.Incoming) { in.Conn.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			s, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, err := c.DialGuest(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(sc, "hello")
	sc.CloseWrite()
	b, err := io.ReadAll(sc)
	if err != nil || string(b) != "hello" {
		t.Fatalf("echo through the forward: %q %v", b, err)
	}
	sc.Close()
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	if _, err := c.DialGuest(ctx, closed); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed port: %v, want ECONNREFUSED", err)
	}
	ports, err := c.Ports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range ports {
		found = found || p.Port == port && p.Addr == "127.0.0.1"
	}
	if !found {
		t.Errorf("ports %+v do not list 127.0.0.1:%d", ports, port)
	}
}

func TestProcNetLine(t *testing.T) {
	for line, want := range map[string]string{
		"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0": "127.0.0.1:8080",
		"   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1":                  "0.0.0.0:80",
		"   2: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 1":                  "",
		"   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 0":                        "::1:8080",
		"  sl  local_address rem_address   st": "",
	} {
		p, ok := parseProcNetLine(line)
		got := ""
		if ok {
			got = p.Addr + ":" + strconv.Itoa(p.Port)
		}
		if got != want {
			t.Errorf("%q: %q, want %q", line, got, want)
		}
	}
}

func TestProxyEnv(t *testing.T) {
	a, err := New(Config{Workspace: t.TempDir(), Proxy: "127.0.0.1:3128"})
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(a.env(&guest.ExecRequest{Env: map[string]string{"no_proxy": "mine"}}, nil), "\n")
	for _, want := range []string{"http_proxy=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "HTTPS_PROXY=http://127.0.0.1:3128", "no_proxy=mine", "NO_PROXY=" + guest.NoProxy} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
	}
}
