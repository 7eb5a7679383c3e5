package ui

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// N changes the selected session's policy; F starts a forward the TUI owns,
// and the Info tab shows the policy, the guest's ports and the forward.
func TestNetworkPolicyAndForwardFromTheTUI(t *testing.T) {
	t.Parallel()
	f := fixture()
	h := newHarness(t, f, Options{})
	h.press("N")
	if !strings.Contains(h.screen(), "Network of alpha") {
		t.Fatalf("no network dialog:\n%s", h.screen())
	}
	h.typeText("allow:")
	h.press("enter")
	if h.m.dialog == nil || f.Calls("SetNet") != 0 {
		t.Fatalf("a malformed policy was sent or closed the dialog:\n%s", h.screen())
	}
	for range len("allow:") {
		h.press("backspace")
	}
	h.typeText("allow:pypi.org")
	h.press("enter")
	h.waitFor("policy set", func() bool { s, _ := h.m.sessions.Get("alpha"); return s.Net == "allow:pypi.org" })

	if err := f.Serve("alpha", 8080, func(c net.Conn) {
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	}); err != nil {
		t.Fatal(err)
	}
	h.press("P")
	if !strings.Contains(h.screen(), "Forward a port into alpha") {
		t.Fatalf("no forward dialog:\n%s", h.screen())
	}
	h.typeText("0:8080")
	h.press("enter")
	h.waitFor("forwarding", func() bool { return strings.HasPrefix(h.flash(), "forwarding 127.0.0.1:") })
	addr := strings.Fields(h.flash())[1]
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" {
		t.Fatalf("through the TUI's forward: %q", b)
	}
	if got := h.m.forwards.list("alpha"); len(got) != 1 || !strings.HasPrefix(got[0], addr+"→8080") {
		t.Errorf("forwards %v", got)
	}
	h.press("enter") // open alpha
	h.press("4")
	h.waitFor("network line", func() bool {
		scr := h.screen()
		return strings.Contains(scr, "allow:pypi.org · listening 8080") && strings.Contains(scr, "forwards "+addr+"→8080")
	})
}
