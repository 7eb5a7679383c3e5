package api

import (
	"context"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berthvm/berth/session/sessiontest"
)

var updateDoc = flag.Bool("update", false, "rewrite the package doc's Routes section from the route table")

// The package doc's Routes section is the route table, rendered.
func TestRoutesDoc(t *testing.T) {
	s := NewServer(sessiontest.New(sessiontest.Options{}), nil).(*server)
	rs := s.routes()
	seen := map[string]bool{}
	for _, r := range rs {
		key := r.method + " " + r.pattern
		if seen[key] {
			t.Errorf("route %s twice", key)
		}
		seen[key] = true
		if r.doc == "" || r.handler == nil {
			t.Errorf("route %s has no doc or no handler", key)
		}
	}
	src, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	const head = "// Routes:\n//\n"
	i := strings.Index(string(src), head)
	if i < 0 {
		t.Fatal("api.go has no Routes section")
	}
	i += len(head)
	j := strings.Index(string(src[i:]), "//\n")
	if j < 0 {
		t.Fatal("the Routes section does not end")
	}
	got, want := string(src[i:i+j]), routesDoc(rs)
	if got == want {
		return
	}
	if *updateDoc {
		out := string(src[:i]) + want + string(src[i+j:])
		if err := os.WriteFile("api.go", []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("api.go's Routes section differs from the route table (go test -run TestRoutesDoc -update rewrites it):\n got:\n%s\nwant:\n%s", got, want)
}

// Every call the client makes lands on a route of the table: the whole
// conformance suite through the client, none falling to "no route".
func TestClientCallsAreRoutes(t *testing.T) {
	fake := sessiontest.New(sessiontest.Options{})
	s := NewServer(fake, nil).(*server)
	var mu sync.Mutex
	unrouted := map[string]bool{}
	check := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := s.mux.Handler(r); pattern == "/" {
			mu.Lock()
			unrouted[r.Method+" "+r.URL.Path] = true
			mu.Unlock()
		}
		s.ServeHTTP(w, r)
	})
	dir, err := os.MkdirTemp("", "berth-routes")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ln, err := Listen(filepath.Join(dir, "berth.sock"))
	if err != nil {
		t.Fatal(err)
	}
	base, stop := context.WithCancel(context.Background())
	srv := &http.Server{Handler: check, BaseContext: func(net.Listener) context.Context { return base }}
	go srv.Serve(ln)
	defer func() { stop(); srv.Close(); fake.Close() }()
	c := Dial(filepath.Join(dir, "berth.sock"))
	defer c.Close()
	sessiontest.Suite(t, c)
	sessiontest.HarnessSuite(t, c)
	for call := range unrouted {
		t.Errorf("the client called %s, which no route of the table serves", call)
	}
}
