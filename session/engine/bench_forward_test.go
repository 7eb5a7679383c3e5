package engine_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthvm/berth/session/api"
)

// TestBenchForward prints issue 28's port figures: a forward's
// connection setup (p50 of the API's Forward, which returns once the
// guest's port answered) and a 100 MB download through berth
// port-forward, through the NIC's stack against through the agent, both
// into the same guest in this run (the daemon restarted with
// BERTH_FORWARD_VIA_AGENT for the second), with berth exec -- true as
// the scale. It runs only under `make bench`.
func TestBenchForward(t *testing.T) {
	needBench(t)
	const size = 100 << 20
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"256M\"\nidle_timeout = \"0\"\nnet_nic = true\n")
	e.OK("create", "fb", "--net", "allow:host.berth.internal:1")
	guestHTTPD(e, "fb", "8080")
	e.OK("exec", "fb", "--", "dd", "if=/dev/zero", "of=/workspace/www/big", "bs=1M", "count=100")

	type figures struct {
		setup, exec time.Duration
		mbs         float64
	}
	measure := func(carrier, wantPeer string) figures {
		fw := e.portForward("fb", fmt.Sprintf("%d:8080", freePort(t)))
		defer func() { fw.cmd.Process.Kill(); fw.cmd.Wait() }()
		if p := peer(t, fw.addrs[0]); p != wantPeer {
			t.Fatalf("through the %s the guest saw %q connect, want %s", carrier, p, wantPeer)
		}
		c := api.Dial(filepath.Join(e.Data, "berth.sock"))
		defer c.Close()
		ctx := context.Background()
		var setup, execRT []time.Duration
		for i := range 45 {
			start := time.Now()
			conn, err := c.Forward(ctx, "fb", 8080)
			if err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			conn.Close()
			start = time.Now()
			e.OK("exec", "fb", "--", "true")
			if i >= 5 {
				setup, execRT = append(setup, d), append(execRT, time.Since(start))
			}
		}
		hc := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
		start := time.Now()
		resp, err := hc.Get("http://" + fw.addrs[0] + "/big")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != size {
			t.Fatalf("the %s carried %d bytes of %d", carrier, n, size)
		}
		return figures{setup: median(setup), exec: median(execRT), mbs: float64(size) / time.Since(start).Seconds() / 1e6}
	}
	nic := measure("NIC's stack", "10.0.2.2")
	e.KillDaemon()
	t.Setenv("BERTH_FORWARD_VIA_AGENT", "1") // the daemon inherits it
	e.StartDaemon()
	agent := measure("agent", "127.0.0.1")

	t.Logf("BENCH %-40s %10s vs agent %10s  ratio %.2fx  (exec true %s / %s)", "forward setup p50 via the NIC's stack",
		nic.setup.Round(time.Microsecond), agent.setup.Round(time.Microsecond), float64(nic.setup)/float64(agent.setup),
		nic.exec.Round(time.Microsecond), agent.exec.Round(time.Microsecond))
	t.Logf("BENCH %-40s %7.0f MB/s vs agent %7.0f MB/s  ratio %.2fx", "port-forward 100 MB via the NIC's stack", nic.mbs, agent.mbs, nic.mbs/agent.mbs)
}
