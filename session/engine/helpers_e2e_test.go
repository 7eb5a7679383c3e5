package engine_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/engine"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// needImports skips t unless it may boot VMs and import images (which
// needs root: layers keep owners and device nodes).
func needImports(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs")
	}
	if os.Geteuid() != 0 {
		t.Skip("imports need root: layers keep owners and device nodes")
	}
}

// staticBusybox is Debian's static busybox, the one program of the test
// images; t is skipped without it or without imports.
func staticBusybox(t *testing.T) []byte {
	t.Helper()
	needImports(t)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no busybox to build the image from (Debian's busybox-static): %v", err)
	}
	if out, _ := exec.Command("ldd", "/bin/busybox").CombinedOutput(); !strings.Contains(string(out), "not a dynamic") {
		t.Skip("/bin/busybox is not static (Debian's busybox-static has a static one)")
	}
	return bb
}

// newImageEnv starts a daemon on a data directory of the test's own,
// which shares the built images named in shared (mini always, as DataDir
// has it) but not the layer cache, so imports write theirs here. Without
// templates no template is booted: each boot is one the test asked for.
func newImageEnv(t *testing.T, templates bool, shared ...image.Image) (*env, string) {
	t.Helper()
	data := t.TempDir()
	images := filepath.Join(data, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, im := range append([]image.Image{vmmtest.Image(t)}, shared...) {
		if err := os.Symlink(filepath.Dir(im.Dir), filepath.Join(images, im.Name)); err != nil {
			t.Fatal(err)
		}
	}
	if !templates {
		t.Setenv("BERTH_NO_TEMPLATES", "1")
	}
	e := newEnvAt(t, data)
	e.StartDaemon()
	return e, data
}

// needBench skips t outside `make bench`.
func needBench(t *testing.T) {
	t.Helper()
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
}

// newBenchEnv starts a daemon of its own with config as its config.toml.
func newBenchEnv(t *testing.T, config string, daemonArgs ...string) *env {
	t.Helper()
	e := newEnv(t)
	if err := os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	e.StartDaemon(daemonArgs...)
	return e
}

// serveSocket serves m on a socket API of its own, as the daemon does,
// and is a client of it; both are closed when t ends.
func serveSocket(t *testing.T, m *engine.Manager) *api.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "berth.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewServer(m, nil)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := api.Dial(sock)
	t.Cleanup(func() { c.Close() })
	return c
}
