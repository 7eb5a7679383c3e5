package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// daemonCPU is the CPU time the process pid has used.
func daemonCPU(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

// TestBenchNet prints issue 15's figures against limits measured in the
// same run. It runs only under `make bench`.
func TestBenchNet(t *testing.T) {
	needBench(t)
	ctx := context.Background()
	const size = 100 << 20
	mbs := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }

	// The limit: the raw channel's bulk figure, on a VM of its own.
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	b.Agent.Close()
	conn, err := b.VM.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := guest.RawBulk(ctx, conn, bufio.NewReaderSize(conn, 256<<10), size)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	b.VM.Kill(ctx)

	zeros := make([]byte, 1<<20)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for i := 0; i < size>>20; i++ {
			w.Write(zeros)
		}
	}))
	defer up.Close()
	hp := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)

	e := newEnv(t)
	e.StartDaemon()
	e.OK("create", "nb", "--disk", "256M", "--net", "allow:host.berth.internal:"+hp)

	start := time.Now()
	e.OK("exec", "nb", "--", "wget", "-q", "-O", "/dev/null", "http://host.berth.internal:"+hp+"/big")
	egress := time.Since(start)
	t.Logf("BENCH %-40s %7.0f MB/s vs raw %7.0f MB/s  ratio %.2fx  (target ≥ 0.5x)", "egress: 100 MB download via the proxy", mbs(egress), mbs(raw), mbs(egress)/mbs(raw))

	// Port-forward: a busybox httpd on the guest's loopback.
	e.OK("exec", "nb", "--", "sh", "-c", "mkdir -p /workspace/www && echo hi > /workspace/www/index.html && "+
		"dd if=/dev/zero of=/workspace/www/big bs=1M count=100 2>/dev/null && httpd -p 127.0.0.1:8080 -h /workspace/www </dev/null >/dev/null 2>&1")
	fw := e.portForward("nb", fmt.Sprintf("%d:8080", freePort(t)))
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	var fwdRT, execRT []time.Duration
	for i := 0; i < 40; i++ {
		start := time.Now()
		resp, err := hc.Get("http://" + fw.addrs[0] + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fwdRT = append(fwdRT, time.Since(start))
		start = time.Now()
		e.OK("exec", "nb", "--", "true")
		execRT = append(execRT, time.Since(start))
	}
	t.Logf("BENCH %-40s %10s vs exec %10s  ratio %.2fx  (target ≤ 1x)", "port-forward HTTP round trip p50", median(fwdRT).Round(time.Microsecond), median(execRT).Round(time.Microsecond), float64(median(fwdRT))/float64(median(execRT)))
	// What the guest's client and the host-to-guest direction manage
	// without the proxy: busybox wget from the guest's own httpd, and
	// 100 MB sent to a command's stdin over the agent channel.
	start = time.Now()
	e.OK("exec", "nb", "--", "wget", "-Y", "off", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/big")
	localWget := time.Since(start)
	start = time.Now()
	e.RunIn(string(make([]byte, size)), "exec", "nb", "--", "sh", "-c", "cat > /dev/null")
	stdin := time.Since(start)
	t.Logf("BENCH %-40s %7.0f MB/s; 100 MB to a command's stdin (host to guest) %7.0f MB/s  (context)", "guest wget from guest httpd", mbs(localWget), mbs(stdin))
	start = time.Now()
	resp, err := hc.Get("http://" + fw.addrs[0] + "/big")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fwd := time.Since(start)
	if n != size {
		t.Fatalf("forward carried %d bytes", n)
	}
	t.Logf("BENCH %-40s %7.0f MB/s vs raw %7.0f MB/s  ratio %.2fx  (report)", "port-forward: 100 MB download", mbs(fwd), mbs(raw), mbs(fwd)/mbs(raw))

	// Connections per second at 50 concurrent clients, against the same
	// load on the guest's own loopback (no proxy), and the daemon's CPU.
	load := func(flags, url string) time.Duration {
		start := time.Now()
		out := e.OK("exec", "nb", "--", "sh", "-c", "for i in $(seq 50); do (for j in $(seq 20); do wget "+flags+" -q -O /dev/null "+url+" || echo fail; done) & done; wait")
		if n := strings.Count(out, "fail"); n > 0 {
			t.Fatalf("%d of 1000 requests to %s failed", n, url)
		}
		return time.Since(start)
	}
	local := load("-Y off", "http://127.0.0.1:8080/")
	cpu0 := daemonCPU(t, e.Daemon.Process.Pid)
	proxied := load("", "http://host.berth.internal:"+hp+"/small")
	cpu := daemonCPU(t, e.Daemon.Process.Pid) - cpu0
	cps := func(d time.Duration) float64 { return 1000 / d.Seconds() }
	t.Logf("BENCH %-40s %7.0f conn/s vs guest-local %7.0f conn/s  ratio %.2fx  daemon CPU %.0f%% (%.2f ms/conn)  (report)", "egress connections, 50 concurrent", cps(proxied), cps(local), cps(proxied)/cps(local), 100*cpu.Seconds()/proxied.Seconds(), float64(cpu.Microseconds())/1000/1000)
}
