package chfake

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// start serves a fake in a fresh directory and returns it with a
// generated client talking to it over the socket.
func start(t *testing.T, opts Options) (*Server, *chapi.ClientWithResponses, string) {
	t.Helper()
	dir := t.TempDir()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s := New(opts)
	sock := filepath.Join(dir, "api.sock")
	if err := s.Serve(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	c, err := chapi.NewClientWithResponses("http://localhost/api/v1", chapi.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	return s, c, dir
}

type response interface {
	StatusCode() int
	GetBody() []byte
}

// expect checks an answer's status and, for errors, that the body is a
// JSON array of strings whose last element contains want.
func expect(t *testing.T, what string, rsp response, err error, status int, want string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got := rsp.StatusCode(); got != status {
		t.Fatalf("%s: status %d, want %d (body %s)", what, got, status, rsp.GetBody())
	}
	if status < 300 || want == "-" {
		return
	}
	var msgs []string
	if err := json.Unmarshal(rsp.GetBody(), &msgs); err != nil || len(msgs) == 0 {
		t.Fatalf("%s: error body %q is not a JSON array of strings", what, rsp.GetBody())
	}
	if !strings.Contains(msgs[len(msgs)-1], want) {
		t.Fatalf("%s: error %q, want it to end with %q", what, msgs, want)
	}
}

func vmConfig(t *testing.T, dir string) chapi.VmConfig {
	t.Helper()
	kernel := filepath.Join(dir, "vmlinuz")
	disk := filepath.Join(dir, "disk.img")
	for _, f := range []string{kernel, disk} {
		if err := os.WriteFile(f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	console := filepath.Join(dir, "console.log")
	raw := chapi.Raw
	return chapi.VmConfig{
		Payload: chapi.PayloadConfig{Kernel: &kernel},
		Cpus:    &chapi.CpusConfig{BootVcpus: 1, MaxVcpus: 1},
		Memory:  &chapi.MemoryConfig{Size: 64 << 20},
		Disks:   &[]chapi.DiskConfig{{Path: &disk, ImageType: &raw}},
		Serial:  &chapi.SerialConfig{Mode: chapi.ConsoleModeFile, File: &console},
		Console: &chapi.ConsoleConfig{Mode: chapi.ConsoleModeOff},
		Vsock:   &chapi.VsockConfig{Cid: 3, Socket: filepath.Join(dir, "vsock.sock")},
	}
}

func state(t *testing.T, c *chapi.ClientWithResponses) chapi.VmState {
	t.Helper()
	rsp, err := c.GetVmInfoWithResponse(context.Background())
	expect(t, "vm.info", rsp, err, 200, "")
	if rsp.JSON200 == nil {
		t.Fatalf("vm.info: no JSON body decoded (Content-Type %q)", rsp.HTTPResponse.Header.Get("Content-Type"))
	}
	return rsp.JSON200.State
}

// TestLifecycleStatusCodes walks the VM state machine through the
// generated client, checking CH v53.0's real status codes and bodies.
func TestLifecycleStatusCodes(t *testing.T) {
	s, c, dir := start(t, Options{Pid: 4242})
	ctx := context.Background()

	ping, err := c.GetVmmPingWithResponse(ctx)
	expect(t, "vmm.ping", ping, err, 200, "")
	if ping.JSON200 == nil || *ping.JSON200.Pid != 4242 || ping.JSON200.Version != Version {
		t.Fatalf("vmm.ping = %s", ping.Body)
	}

	info, err := c.GetVmInfoWithResponse(ctx)
	expect(t, "vm.info before create", info, err, 404, "VM is not created")
	boot, err := c.BootVMWithResponse(ctx)
	expect(t, "vm.boot before create", boot, err, 404, "VM is not created")
	pause, err := c.PauseVMWithResponse(ctx)
	expect(t, "vm.pause before create", pause, err, 500, "VM is not running")

	bad, err := c.CreateVMWithBodyWithResponse(ctx, "application/json", strings.NewReader("{nope"))
	expect(t, "vm.create bad JSON", bad, err, 400, "-")

	// vm.create validates nothing: an empty payload is accepted, and only
	// vm.boot fails.
	create, err := c.CreateVMWithResponse(ctx, chapi.VmConfig{})
	expect(t, "vm.create empty", create, err, 204, "")
	if got := state(t, c); got != chapi.Created {
		t.Fatalf("state after create = %s", got)
	}
	create, err = c.CreateVMWithResponse(ctx, chapi.VmConfig{})
	expect(t, "second vm.create", create, err, 500, "VM is already created")
	boot, err = c.BootVMWithResponse(ctx)
	expect(t, "vm.boot without kernel", boot, err, 500, "No kernel or firmware")
	del, err := c.DeleteVMWithResponse(ctx)
	expect(t, "vm.delete", del, err, 204, "")
	del, err = c.DeleteVMWithResponse(ctx)
	expect(t, "vm.delete of nothing", del, err, 204, "")

	cfg := vmConfig(t, dir)
	create, err = c.CreateVMWithResponse(ctx, cfg)
	expect(t, "vm.create", create, err, 204, "")
	boot, err = c.BootVMWithResponse(ctx)
	expect(t, "vm.boot", boot, err, 204, "")
	if got := state(t, c); got != chapi.Running {
		t.Fatalf("state after boot = %s", got)
	}
	boot, err = c.BootVMWithResponse(ctx)
	expect(t, "second vm.boot", boot, err, 500, "VM is already created")

	resume, err := c.ResumeVMWithResponse(ctx)
	expect(t, "vm.resume while running", resume, err, 500, "Invalid transition")
	snapDir := t.TempDir()
	url := "file://" + snapDir
	snap, err := c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	expect(t, "vm.snapshot while running", snap, err, 500, "while VM is running")

	pause, err = c.PauseVMWithResponse(ctx)
	expect(t, "vm.pause", pause, err, 204, "")
	pause, err = c.PauseVMWithResponse(ctx)
	expect(t, "vm.pause while paused", pause, err, 500, "Invalid transition")
	if got := state(t, c); got != chapi.Paused {
		t.Fatalf("state after pause = %s", got)
	}
	snap, err = c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	expect(t, "vm.snapshot", snap, err, 204, "")
	for _, f := range []string{snapConfig, snapState, snapMemory} {
		if _, err := os.Stat(filepath.Join(snapDir, f)); err != nil {
			t.Errorf("snapshot file: %v", err)
		}
	}
	snap, err = c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	expect(t, "vm.snapshot into a used directory", snap, err, 500, "file exists")
	if got := state(t, c); got != chapi.Paused {
		t.Fatalf("state after snapshot = %s, want Paused", got)
	}
	resume, err = c.ResumeVMWithResponse(ctx)
	expect(t, "vm.resume", resume, err, 204, "")

	// vm.restore needs a fresh VMM.
	restore, err := c.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: url})
	expect(t, "vm.restore on a used VMM", restore, err, 500, "VM is already created")

	// vm.shutdown keeps the config: Created, and vm.boot works again.
	shut, err := c.ShutdownVMWithResponse(ctx)
	expect(t, "vm.shutdown", shut, err, 204, "")
	if got := state(t, c); got != chapi.Created {
		t.Fatalf("state after shutdown = %s, want Created", got)
	}
	if _, err := os.Stat(cfg.Vsock.Socket); !os.IsNotExist(err) {
		t.Errorf("vsock socket after shutdown: %v, want it removed", err)
	}
	shut, err = c.ShutdownVMWithResponse(ctx)
	expect(t, "vm.shutdown while not running", shut, err, 500, "VM is not running")
	boot, err = c.BootVMWithResponse(ctx)
	expect(t, "vm.boot after shutdown", boot, err, 204, "")

	pb, err := c.PowerButtonVMWithResponse(ctx)
	expect(t, "vm.power-button", pb, err, 204, "")
	select {
	case <-s.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("VMM did not exit after the guest powered off")
	}
	if s.ExitCode() != 0 {
		t.Errorf("exit code after poweroff = %d, want 0", s.ExitCode())
	}
}

func TestRouting(t *testing.T) {
	_, c, _ := start(t, Options{})
	ctx := context.Background()
	hc := c.ClientInterface.(*chapi.Client).Client

	// A wrong method is a bare 400, never the spec's 405.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost/api/v1/vm.pause", nil)
	rsp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(rsp.Body)
	rsp.Body.Close()
	if rsp.StatusCode != 400 || len(body) != 0 {
		t.Errorf("GET vm.pause = %d %q, want 400 with no body", rsp.StatusCode, body)
	}

	req, _ = http.NewRequestWithContext(ctx, http.MethodPut, "http://localhost/api/v1/vm.nothing", nil)
	rsp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(rsp.Body)
	rsp.Body.Close()
	if rsp.StatusCode != 404 || string(body) != `["Not Found"]` {
		t.Errorf("PUT vm.nothing = %d %s, want 404 [\"Not Found\"]", rsp.StatusCode, body)
	}
}

func TestRestore(t *testing.T) {
	_, c, dir := start(t, Options{})
	ctx := context.Background()
	cfg := vmConfig(t, dir)
	expectOK := func(what string, rsp response, err error) {
		t.Helper()
		expect(t, what, rsp, err, 204, "")
	}
	r1, err := c.CreateVMWithResponse(ctx, cfg)
	expectOK("create", r1, err)
	r2, err := c.BootVMWithResponse(ctx)
	expectOK("boot", r2, err)
	r3, err := c.PauseVMWithResponse(ctx)
	expectOK("pause", r3, err)
	snapDir := t.TempDir()
	url := "file://" + snapDir
	r4, err := c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	expectOK("snapshot", r4, err)
	r5, err := c.DeleteVMWithResponse(ctx)
	expectOK("delete", r5, err)

	// A restore reopens the recorded paths, so a stale vsock socket fails
	// it, and the failed restore leaves no VM behind.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Vsock.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	r6, err := c.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: url})
	expect(t, "restore over a stale vsock socket", r6, err, 500, "address already in use")
	info, err := c.GetVmInfoWithResponse(ctx)
	expect(t, "vm.info after failed restore", info, err, 404, "VM is not created")
	os.Remove(cfg.Vsock.Socket)

	r7, err := c.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: url})
	expectOK("restore", r7, err)
	if got := state(t, c); got != chapi.Paused {
		t.Fatalf("state after restore = %s, want Paused", got)
	}

	// resume:true comes back running.
	r8, err := c.DeleteVMWithResponse(ctx)
	expectOK("delete", r8, err)
	yes := true
	r9, err := c.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: url, Resume: &yes})
	expectOK("restore resume", r9, err)
	if got := state(t, c); got != chapi.Running {
		t.Fatalf("state after restore with resume = %s, want Running", got)
	}
}

// TestDiskLock checks that a booted VM holds its disk as CH does, so a
// second VM on the same image fails at boot.
func TestDiskLock(t *testing.T) {
	_, c1, dir := start(t, Options{})
	_, c2, dir2 := start(t, Options{})
	ctx := context.Background()
	cfg := vmConfig(t, dir)
	r, err := c1.CreateVMWithResponse(ctx, cfg)
	expect(t, "create", r, err, 204, "")
	b, err := c1.BootVMWithResponse(ctx)
	expect(t, "boot", b, err, 204, "")

	cfg2 := vmConfig(t, dir2)
	cfg2.Disks = cfg.Disks
	r, err = c2.CreateVMWithResponse(ctx, cfg2)
	expect(t, "create 2", r, err, 204, "")
	b, err = c2.BootVMWithResponse(ctx)
	expect(t, "boot on a locked disk", b, err, 500, "already locked")
}

// TestSingleThreaded checks that a slow action holds up vmm.ping, as CH's
// one API thread does.
func TestSingleThreaded(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	_, c, dir := start(t, Options{BeforeAction: func(op string) {
		if op == "vm.boot" {
			close(entered)
			<-release
		}
	}})
	ctx := context.Background()
	r, err := c.CreateVMWithResponse(ctx, vmConfig(t, dir))
	expect(t, "create", r, err, 204, "")

	bootDone := make(chan error, 1)
	go func() {
		_, err := c.BootVMWithResponse(ctx)
		bootDone <- err
	}()
	<-entered
	pingDone := make(chan error, 1)
	go func() {
		_, err := c.GetVmmPingWithResponse(ctx)
		pingDone <- err
	}()
	select {
	case <-pingDone:
		t.Fatal("vmm.ping answered while vm.boot held the API thread")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-bootDone; err != nil {
		t.Fatal(err)
	}
	if err := <-pingDone; err != nil {
		t.Fatal(err)
	}
}

func TestInjectedFault(t *testing.T) {
	s, c, dir := start(t, Options{})
	ctx := context.Background()
	r, err := c.CreateVMWithResponse(ctx, vmConfig(t, dir))
	expect(t, "create", r, err, 204, "")
	b, err := c.BootVMWithResponse(ctx)
	expect(t, "boot", b, err, 204, "")

	s.Inject("vm.pause", Fault{After: true})
	p, err := c.PauseVMWithResponse(ctx)
	expect(t, "vm.pause with fault after", p, err, 500, "injected failure")
	if got := state(t, c); got != chapi.Paused {
		t.Fatalf("state = %s, want Paused: the action took effect", got)
	}
	s.Inject("vm.resume", Fault{Status: 503, Messages: []string{"x"}})
	rs, err := c.ResumeVMWithResponse(ctx)
	expect(t, "vm.resume with fault", rs, err, 503, "x")
	if got := state(t, c); got != chapi.Paused {
		t.Fatalf("state = %s, want Paused: the action did not happen", got)
	}
}

// dialVsock does the hybrid vsock handshake by hand.
func dialVsock(t *testing.T, path string, port int) (net.Conn, string) {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "connect "+strconv.Itoa(port)+"\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return conn, line
}

func TestVsockMuxer(t *testing.T) {
	s, c, dir := start(t, Options{})
	ctx := context.Background()
	cfg := vmConfig(t, dir)
	r, err := c.CreateVMWithResponse(ctx, cfg)
	expect(t, "create", r, err, 204, "")
	b, err := c.BootVMWithResponse(ctx)
	expect(t, "boot", b, err, 204, "")

	// Nothing listens yet: closed without a word.
	_, line := dialVsock(t, cfg.Vsock.Socket, AgentPort)
	if line != "" {
		t.Fatalf("reply with no guest listening = %q, want none", line)
	}

	s.Listen(AgentPort, EchoGuest)
	_, line = dialVsock(t, cfg.Vsock.Socket, AgentPort)
	if !strings.HasPrefix(line, "OK ") {
		t.Fatalf("reply = %q, want OK <port>", line)
	}

	// An invalid command is dropped.
	conn, err := net.Dial("unix", cfg.Vsock.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "HELLO 1024\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after a bad command: read %d, %v; want EOF", n, err)
	}

	// Shutting the VM down drops guest connections.
	conn2, line := dialVsock(t, cfg.Vsock.Socket, AgentPort)
	if !strings.HasPrefix(line, "OK ") {
		t.Fatalf("reply = %q", line)
	}
	sh, err := c.ShutdownVMWithResponse(ctx)
	expect(t, "shutdown", sh, err, 204, "")
	buf := make([]byte, 64)
	for {
		if _, err := conn2.Read(buf); err != nil {
			break
		}
	}
}

func TestMainArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--api-socket", "path=/x/a.sock"}, "/x/a.sock"},
		{[]string{"-v", "--api-socket=path=/x/b.sock,fd=3"}, "/x/b.sock"},
		{[]string{"--api-socket", "/x/c.sock"}, "/x/c.sock"},
		{[]string{"--kernel", "k"}, ""},
	} {
		if got := apiSocketArg(tc.args); got != tc.want {
			t.Errorf("apiSocketArg(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// image writes a disk image of size bytes into dir.
func image(t *testing.T, dir, name string, size int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func disk(path, id string, readonly bool, slot *uint8) chapi.DiskConfig {
	raw := chapi.Raw
	dc := chapi.DiskConfig{Path: &path, Readonly: &readonly, ImageType: &raw, PciDeviceId: slot}
	if id != "" {
		dc.Id = &id
	}
	return dc
}

func slot(n uint8) *uint8 { return &n }

// pciAddrs reads the PCI address of every device in vm.info's device tree.
func pciAddrs(t *testing.T, c *chapi.ClientWithResponses) map[string]string {
	t.Helper()
	rsp, err := c.GetVmInfoWithResponse(context.Background())
	expect(t, "vm.info", rsp, err, 200, "")
	out := make(map[string]string)
	if rsp.JSON200.DeviceTree == nil {
		return out
	}
	for _, n := range *rsp.JSON200.DeviceTree {
		if n.PciBdf != nil && n.Children != nil && len(*n.Children) == 1 {
			out[(*n.Children)[0]] = *n.PciBdf
		}
	}
	return out
}

func diskIDs(t *testing.T, c *chapi.ClientWithResponses) []string {
	t.Helper()
	rsp, err := c.GetVmInfoWithResponse(context.Background())
	expect(t, "vm.info", rsp, err, 200, "")
	var ids []string
	if d := rsp.JSON200.Config.Disks; d != nil {
		for _, dc := range *d {
			if dc.Id != nil {
				ids = append(ids, *dc.Id)
			}
		}
	}
	return ids
}

// TestPCISlots: disks take their pci_device_id or the lowest free slot,
// in order, then virtio-rng and vsock the next free ones.
func TestPCISlots(t *testing.T) {
	_, c, dir := start(t, Options{})
	ctx := context.Background()
	cfg := vmConfig(t, dir)
	cfg.Disks = &[]chapi.DiskConfig{
		disk(image(t, dir, "a.img", 4096), "a", false, slot(5)),
		disk(image(t, dir, "b.img", 4096), "b", false, nil),
		disk(image(t, dir, "c.img", 4096), "", true, nil),
	}
	r, err := c.CreateVMWithResponse(ctx, cfg)
	expect(t, "create", r, err, 204, "")
	b, err := c.BootVMWithResponse(ctx)
	expect(t, "boot", b, err, 204, "")
	got := pciAddrs(t, c)
	want := map[string]string{"a": "0000:00:05.0", "b": "0000:00:01.0", "_disk2": "0000:00:02.0", rngID: "0000:00:03.0", vsockID: "0000:00:04.0"}
	if len(got) != len(want) {
		t.Errorf("PCI devices = %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s at %q, want %s", id, got[id], w)
		}
	}
}

func TestBootDiskValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		disks func(dir string) []chapi.DiskConfig
		want  string
	}{
		{"duplicate id", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(image(t, dir, "a.img", 4096), "x", false, nil), disk(image(t, dir, "b.img", 4096), "x", true, nil)}
		}, "Identifier x is not unique"},
		{"reserved id", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(image(t, dir, "a.img", 4096), "__x", false, nil)}
		}, "Identifier __x is not invalid"},
		{"root slot", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(image(t, dir, "a.img", 4096), "a", false, slot(0))}
		}, "is reserved"},
		{"slot out of range", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(image(t, dir, "a.img", 4096), "a", false, slot(32))}
		}, "out of the supported range"},
		{"slot taken", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(image(t, dir, "a.img", 4096), "a", false, slot(4)), disk(image(t, dir, "b.img", 4096), "b", false, slot(4))}
		}, "already used: 4"},
		{"missing image", func(dir string) []chapi.DiskConfig {
			return []chapi.DiskConfig{disk(filepath.Join(dir, "nope.img"), "a", false, nil)}
		}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c, dir := start(t, Options{})
			ctx := context.Background()
			cfg := vmConfig(t, dir)
			disks := tc.disks(dir)
			cfg.Disks = &disks
			r, err := c.CreateVMWithResponse(ctx, cfg)
			expect(t, "create", r, err, 204, "")
			b, err := c.BootVMWithResponse(ctx)
			expect(t, "boot", b, err, 500, tc.want)
			if st := state(t, c); st != chapi.Created {
				t.Errorf("state after a failed boot = %s, want Created", st)
			}
		})
	}
}

// TestReadonlyDiskLocks: a read-only disk takes a shared lock, a writable
// one an exclusive lock, so readers share and a writer excludes all.
func TestReadonlyDiskLocks(t *testing.T) {
	for _, tc := range []struct {
		first, second bool // readonly
		ok            bool
		want          string
	}{
		{true, true, true, ""},
		{true, false, false, "Failed to get Write lock for disk image"},
		{false, true, false, "Failed to get Read lock for disk image"},
		{false, false, false, "Failed to get Write lock for disk image"},
	} {
		t.Run(fmt.Sprintf("readonly %v then %v", tc.first, tc.second), func(t *testing.T) {
			img := image(t, t.TempDir(), "shared.img", 1<<20)
			_, c1, dir1 := start(t, Options{})
			_, c2, dir2 := start(t, Options{})
			ctx := context.Background()
			cfg := vmConfig(t, dir1)
			cfg.Disks = &[]chapi.DiskConfig{disk(img, "d", tc.first, nil)}
			r, err := c1.CreateVMWithResponse(ctx, cfg)
			expect(t, "create 1", r, err, 204, "")
			b, err := c1.BootVMWithResponse(ctx)
			expect(t, "boot 1", b, err, 204, "")

			cfg2 := vmConfig(t, dir2)
			cfg2.Disks = &[]chapi.DiskConfig{disk(img, "d", tc.second, nil)}
			r, err = c2.CreateVMWithResponse(ctx, cfg2)
			expect(t, "create 2", r, err, 204, "")
			b, err = c2.BootVMWithResponse(ctx)
			if tc.ok {
				expect(t, "boot 2", b, err, 204, "")
				return
			}
			expect(t, "boot 2", b, err, 500, "The file is already locked")
			var msgs []string
			json.Unmarshal(b.Body, &msgs)
			if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, tc.want) }) {
				t.Errorf("error %q lacks %q", msgs, tc.want)
			}
		})
	}
}

// TestDiskLockRange: CH v53.0 locks [0, size) by default, the whole file
// with lock_granularity Full.
func TestDiskLockRange(t *testing.T) {
	for _, tc := range []struct {
		gran    *chapi.LockGranularity
		wantLen int64
	}{{nil, 1 << 20}, {ptr(chapi.ByteRange), 1 << 20}, {ptr(chapi.Full), 0}} {
		_, c, dir := start(t, Options{})
		ctx := context.Background()
		img := image(t, dir, "d.img", 1<<20)
		d := disk(img, "d", false, nil)
		d.LockGranularity = tc.gran
		cfg := vmConfig(t, dir)
		cfg.Disks = &[]chapi.DiskConfig{d}
		r, err := c.CreateVMWithResponse(ctx, cfg)
		expect(t, "create", r, err, 204, "")
		b, err := c.BootVMWithResponse(ctx)
		expect(t, "boot", b, err, 204, "")
		f, err := os.Open(img)
		if err != nil {
			t.Fatal(err)
		}
		lk := unix.Flock_t{Type: unix.F_RDLCK}
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk)
		f.Close()
		if err != nil || lk.Type != unix.F_WRLCK || lk.Start != 0 || lk.Len != tc.wantLen {
			t.Errorf("granularity %v: lock %+v, %v; want a write lock of [0, %d)", tc.gran, lk, err, tc.wantLen)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestAddDisk(t *testing.T) {
	_, c, dir := start(t, Options{})
	ctx := context.Background()
	add := func(dc chapi.DiskConfig) (*chapi.PutVmAddDiskResponse, error) {
		return c.PutVmAddDiskWithResponse(ctx, dc)
	}

	r0, err := add(disk(image(t, dir, "a.img", 4096), "a", false, nil))
	expect(t, "add-disk before create", r0, err, 404, "VM is not created")
	bad, err := c.PutVmAddDiskWithBodyWithResponse(ctx, "application/json", strings.NewReader("{nope"))
	expect(t, "add-disk bad JSON", bad, err, 400, "-")

	cfg := vmConfig(t, dir)
	cfg.Disks = &[]chapi.DiskConfig{disk(image(t, dir, "layer.img", 4096), "layer0", true, slot(6))}
	r, err := c.CreateVMWithResponse(ctx, cfg)
	expect(t, "create", r, err, 204, "")

	// Created, not booted: a cold add, into the config only.
	cold, err := add(disk(image(t, dir, "cold.img", 4096), "cold", false, nil))
	expect(t, "cold add-disk", cold, err, 204, "")
	if got := diskIDs(t, c); !slices.Equal(got, []string{"layer0", "cold"}) {
		t.Fatalf("disks after a cold add = %v", got)
	}
	dup, err := add(disk(image(t, dir, "dup.img", 4096), "cold", false, nil))
	expect(t, "add-disk of a taken id", dup, err, 500, "Identifier cold is not unique")

	b, err := c.BootVMWithResponse(ctx)
	expect(t, "boot", b, err, 204, "")

	ws := image(t, dir, "ws.img", 1<<20)
	hot, err := add(disk(ws, "workspace", false, slot(4)))
	expect(t, "add-disk", hot, err, 200, "")
	if hot.JSON200 == nil || hot.JSON200.Id != "workspace" || hot.JSON200.Bdf != "0000:00:04.0" {
		t.Fatalf("add-disk answer = %s, want workspace at 0000:00:04.0", hot.Body)
	}
	if addr := pciAddrs(t, c)["workspace"]; addr != "0000:00:04.0" {
		t.Errorf("device tree has the workspace at %q", addr)
	}
	// The hot-plugged disk holds its lock like a booted one.
	if f, err := os.OpenFile(ws, os.O_RDWR, 0); err == nil {
		lk := unix.Flock_t{Type: unix.F_RDLCK}
		unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk)
		f.Close()
		if lk.Type != unix.F_WRLCK {
			t.Errorf("hot-plugged workspace lock = %d, want a write lock", lk.Type)
		}
	}

	for _, tc := range []struct {
		name string
		dc   chapi.DiskConfig
		want string
	}{
		{"taken id", disk(image(t, dir, "x.img", 4096), "workspace", false, nil), "Identifier workspace is not unique"},
		{"taken slot", disk(image(t, dir, "y.img", 4096), "y", false, slot(4)), "already used: 4"},
		{"reserved slot", disk(image(t, dir, "z.img", 4096), "z", false, slot(0)), "is reserved"},
		{"missing image", disk(filepath.Join(dir, "nope.img"), "n", false, nil), "no such file"},
		{"image in use", disk(ws, "again", false, nil), "The file is already locked"},
	} {
		rsp, err := add(tc.dc)
		expect(t, "add-disk: "+tc.name, rsp, err, 500, tc.want)
	}
	noID, err := add(disk(image(t, dir, "anon.img", 4096), "", true, nil))
	expect(t, "add-disk without id", noID, err, 200, "")
	if noID.JSON200 == nil || !strings.HasPrefix(noID.JSON200.Id, "_disk") {
		t.Errorf("add-disk without id answered %s, want a _disk id", noID.Body)
	}
	want := []string{"layer0", "cold", "workspace", noID.JSON200.Id}
	if got := diskIDs(t, c); !slices.Equal(got, want) {
		t.Fatalf("disks = %v, want %v", got, want)
	}

	// A snapshot records the hot-plugged disks, and a restore gives every
	// device its PCI slot back.
	before := pciAddrs(t, c)
	p, err := c.PauseVMWithResponse(ctx)
	expect(t, "pause", p, err, 204, "")
	snapDir := t.TempDir()
	url := "file://" + snapDir
	sn, err := c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	expect(t, "snapshot", sn, err, 204, "")
	var sc chapi.VmConfig
	raw, _ := os.ReadFile(filepath.Join(snapDir, snapConfig))
	if err := json.Unmarshal(raw, &sc); err != nil || sc.Disks == nil || len(*sc.Disks) != len(want) {
		t.Fatalf("snapshot config disks: %s, %v", raw, err)
	}
	if !strings.Contains(string(raw), `"memory":{"size":67108864}`) {
		t.Errorf("snapshot config lost the memory size: %s", raw)
	}
	d, err := c.DeleteVMWithResponse(ctx)
	expect(t, "delete", d, err, 204, "")

	_, c2, _ := start(t, Options{})
	rs, err := c2.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: url})
	expect(t, "restore", rs, err, 204, "")
	if got := diskIDs(t, c2); !slices.Equal(got, want) {
		t.Errorf("restored disks = %v, want %v", got, want)
	}
	after := pciAddrs(t, c2)
	if len(after) != len(before) {
		t.Errorf("restored PCI devices %v, want %v", after, before)
	}
	for id, addr := range before {
		if after[id] != addr {
			t.Errorf("restored %s at %q, want %s", id, after[id], addr)
		}
	}
}
