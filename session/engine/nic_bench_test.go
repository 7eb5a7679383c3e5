package engine_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestBenchNIC prints issue 28's bulk figures through the guest's NIC
// against the raw agent channel and the egress proxy, measured in the
// same run. It runs only under `make bench`.
func TestBenchNIC(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	ctx := context.Background()
	const size = 100 << 20
	mbs := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }

	// The baseline: the raw channel's bulk figure (guest to host), on a VM
	// of its own.
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

	// A sink (reads to the end, then closes) and a source (writes size
	// bytes, then closes) on the host's loopback, and an HTTP server of
	// size bytes.
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	go serveEach(sink, func(c net.Conn) { io.CopyBuffer(io.Discard, c, make([]byte, 256<<10)) })
	source, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer source.Close()
	zeros := make([]byte, 1<<20)
	go serveEach(source, func(c net.Conn) {
		for range size >> 20 {
			if _, err := c.Write(zeros); err != nil {
				return
			}
		}
	})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for range size >> 20 {
			w.Write(zeros)
		}
	}))
	defer up.Close()
	port := func(a net.Addr) string { return strconv.Itoa(a.(*net.TCPAddr).Port) }
	sinkAddr, sourceAddr := "host.berth.internal:"+port(sink.Addr()), "host.berth.internal:"+port(source.Addr())
	httpAddr := "host.berth.internal:" + port(up.Listener.Addr())

	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"512M\"\nidle_timeout = \"0\"\n"), 0o644)
	e.StartDaemon()
	e.OK("create", "nicb", "--disk", "128M", "--net", "allow:"+sinkAddr+","+sourceAddr+","+httpAddr)
	e.OK("put", "nicb", buildProbe(t), "nicprobe")
	e.OK("exec", "nicb", "--", "chmod", "755", "/workspace/nicprobe")
	timed := func(args ...string) time.Duration {
		start := time.Now()
		e.OK(append([]string{"exec", "nicb", "--"}, args...)...)
		return time.Since(start)
	}
	pid := e.Daemon.Process.Pid
	cpu0 := daemonCPU(t, pid)
	out := timed("/workspace/nicprobe", "send", sinkAddr, strconv.Itoa(size))
	cpuOut := daemonCPU(t, pid) - cpu0
	cpu0 = daemonCPU(t, pid)
	in := timed("/workspace/nicprobe", "recv", sourceAddr)
	cpuIn := daemonCPU(t, pid) - cpu0
	t.Logf("BENCH %-40s %7.0f MB/s vs raw channel %7.0f MB/s  ratio %.2fx  daemon CPU %.2f s/100 MB  (report)", "NIC: 100 MB guest to host (TCP)", mbs(out), mbs(raw), mbs(out)/mbs(raw), cpuOut.Seconds())
	t.Logf("BENCH %-40s %7.0f MB/s vs raw channel %7.0f MB/s  ratio %.2fx  vs guest-to-host %.2fx (target ≥ 0.8x)  daemon CPU %.2f s/100 MB", "NIC: 100 MB host to guest (TCP)", mbs(in), mbs(raw), mbs(in)/mbs(raw), mbs(in)/mbs(out), cpuIn.Seconds())
	// The same download by the host itself, for reference.
	hostStart := time.Now()
	if resp, err := http.Get(up.URL + "/big"); err != nil {
		t.Fatal(err)
	} else {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	byHost := time.Since(hostStart)
	proxied := timed("wget", "-q", "-O", "/dev/null", "http://"+httpAddr+"/big")
	direct := timed("wget", "-Y", "off", "-q", "-O", "/dev/null", "http://"+httpAddr+"/big")
	t.Logf("BENCH %-40s %7.0f MB/s vs the proxy %7.0f MB/s  ratio %.2fx  (target ≥ 3x); vs the host's own download %7.0f MB/s  ratio %.2fx (report)", "NIC: 100 MB wget download", mbs(direct), mbs(proxied), mbs(direct)/mbs(proxied), mbs(byHost), mbs(direct)/mbs(byHost))

	// Connection setup through the stack (the median of 200 inside the
	// guest: SYN, the policy, the host's dial, SYN-ACK) against the
	// median `berth exec -- true`.
	setupUS, err := strconv.Atoi(strings.TrimSpace(e.OK("exec", "nicb", "--", "/workspace/nicprobe", "dial", sinkAddr, "200")))
	if err != nil {
		t.Fatal(err)
	}
	var execs []time.Duration
	for range 21 {
		execs = append(execs, timed("true"))
	}
	slices.Sort(execs)
	setup := time.Duration(setupUS) * time.Microsecond
	t.Logf("BENCH %-40s %7.2f ms vs exec true p50 %7.2f ms  ratio %.3fx  (report)", "NIC: TCP connection setup p50", setup.Seconds()*1e3, execs[10].Seconds()*1e3, setup.Seconds()/execs[10].Seconds())
}

// serveEach serves each connection of l with f until l closes.
func serveEach(l net.Listener, f func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			f(c)
		}()
	}
}
