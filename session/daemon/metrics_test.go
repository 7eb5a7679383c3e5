package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func TestDaemonMetricsAndHealth(t *testing.T) {
	o := options(t)
	port := freePort(t)
	o.Metrics = port // a bare port: loopback
	start(t, o)
	base := "http://127.0.0.1:" + port
	get := func(path string) (int, string) {
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, "berth_sessions{state=\"running\"} 0") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	code, body = get("/healthz")
	var rep daemon.HealthReport
	if err := json.Unmarshal([]byte(body), &rep); code != 200 || err != nil || rep.Version != "test-1" || rep.Pid == 0 {
		t.Fatalf("/healthz: %d %v %s", code, err, body)
	}
}

func TestDaemonMetricsRefused(t *testing.T) {
	for _, c := range []struct {
		name, addr string
		class      error
		want       string
	}{
		{"not loopback", "0.0.0.0:" + freePort(t), session.ErrInvalid, "--metrics-public"},
		{"bad", "nope", session.ErrInvalid, "HOST:PORT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := options(t)
			o.Metrics = c.addr
			err := daemon.Run(context.Background(), o)
			if !errors.Is(err, c.class) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run with --metrics %s: %v", c.addr, err)
			}
		})
	}
	t.Run("taken", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		o := options(t)
		o.Metrics = ln.Addr().String()
		err = daemon.Run(context.Background(), o)
		if !errors.Is(err, session.ErrConflict) || !strings.Contains(err.Error(), "another --metrics port") {
			t.Fatalf("Run with a taken --metrics: %v", err)
		}
	})
}
