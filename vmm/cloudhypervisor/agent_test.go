package cloudhypervisor

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/agent"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// TestVsockToRealAgent runs the hybrid-vsock dialer against a muxer that,
// like CH's, answers CONNECT with OK and then splices the connection to the
// guest: here the real agent server, serving a temporary workspace. The
// handshake, yamux and the API then work as they do over virtio-serial.
func TestVsockToRealAgent(t *testing.T) {
	ws := t.TempDir()
	a, err := agent.New(agent.Config{Workspace: ws})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := sockPath(t)
	serveMuxer(t, path, func(attempt int, c net.Conn) {
		if attempt == 1 {
			c.Close() // the guest is not listening yet: CH closes
			return
		}
		io.WriteString(c, "OK 3221225472\n")
		a.ServeConn(ctx, c)
	})
	conn, err := VsockDialer{}.Dial(ctx, path, AgentPort)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	c, err := guest.Connect(cctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Hello(cctx)
	if err != nil || !h.Workspace.Mounted {
		t.Fatalf("hello = %+v, %v", h, err)
	}
	r := vmmtest.Run(t, c, "", "sh", "-c", "echo over vsock; echo err >&2; exit 4")
	if r.Err != nil || string(r.Stdout) != "over vsock\n" || string(r.Stderr) != "err\n" || r.Exit.ExitCode != 4 {
		t.Fatalf("exec over vsock: %+v", r)
	}
	if _, err := c.WriteFile(cctx, "f.txt", strings.NewReader("durable"), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(ws + "/f.txt"); string(b) != "durable" {
		t.Fatalf("file = %q", b)
	}
}

// TestDriverSuiteReal runs the same end-to-end suite the QEMU driver passes
// against the real cloud-hypervisor, where it and a working KVM exist.
func TestDriverSuiteReal(t *testing.T) {
	bin, err := exec.LookPath(DefaultBinary)
	switch {
	case err != nil:
		t.Skip("cloud-hypervisor is not on PATH (no Debian package here)")
	case os.Getenv(envKVM) != "1":
		t.Skipf("%s is not 1: KVM is not known to work on this host", envKVM)
	}
	vmmtest.DriverSuite(t, New(Options{Binary: bin, Logger: testLogger(t), KVM: func(context.Context) bool { return true }}))
}
