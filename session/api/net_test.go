package api_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// Policies, status and forwards cross the socket: a forward is one
// upgraded connection carrying bytes both ways, half closes included.
func TestNetOverTheSocket(t *testing.T) {
	h := start(t, nil)
	ctx := t.Context()
	if _, err := h.client.Create(ctx, session.CreateOptions{Name: "a", Net: "allow:pypi.org"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Create(ctx, session.CreateOptions{Name: "b", Net: "allow:10.0.0.0/33"}); !errors.Is(err, session.ErrInvalid) || !strings.Contains(err.Error(), "10.0.0.0/33") {
		t.Fatalf("bad create policy: %v", err)
	}
	s, err := h.client.SetNet(ctx, "a", "open")
	if err != nil || s.Net != "open" {
		t.Fatalf("SetNet: %+v %v", s, err)
	}
	if _, err := h.client.SetNet(ctx, "a", "allow:"); !errors.Is(err, session.ErrInvalid) {
		t.Fatalf("SetNet allow: %v", err)
	}
	if _, err := h.client.SetNet(ctx, "nope", "open"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("SetNet on a missing session: %v", err)
	}
	h.fake.Serve("a", 8080, func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's half close
		c.Write([]byte(strings.ToUpper(string(b))))
	})
	c, err := h.client.Forward(ctx, "a", 8080)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "hello through the socket")
	c.(interface{ CloseWrite() error }).CloseWrite()
	b, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(b) != "HELLO THROUGH THE SOCKET" {
		t.Fatalf("forward: %q %v", b, err)
	}
	if _, err := h.client.Forward(ctx, "a", 9); !errors.Is(err, session.ErrUnavailable) || !strings.Contains(err.Error(), "nothing listens on port 9") {
		t.Fatalf("forward to a closed port: %v", err)
	}
	if _, err := h.client.Forward(ctx, "a", 0); !errors.Is(err, session.ErrInvalid) {
		t.Fatalf("forward to port 0: %v", err)
	}
	st, err := h.client.NetStatus(ctx, "a")
	if err != nil || st.Policy != "open" || len(st.Listening) != 1 || st.Listening[0].Port != 8080 {
		t.Fatalf("NetStatus: %+v %v", st, err)
	}
}
