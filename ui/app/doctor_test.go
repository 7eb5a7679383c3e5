package app

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session/api"
)

// TestDoctorJSON: the same checks as the table, as JSON; the exit code
// says whether every needed check passed.
func TestDoctorJSON(t *testing.T) {
	code, out, errb := run(t, t.TempDir(), "", "doctor", "--json")
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	var names, failed []string
	for _, c := range rep.Checks {
		names = append(names, c.Name)
		if c.Needed && !c.OK {
			failed = append(failed, c.Name)
		}
		if c.Detail == "" && !c.OK {
			t.Errorf("check %s failed without saying why", c.Name)
		}
	}
	want := []string{"qemu", "image mini", "kvm", "tcg", "cloud-hypervisor", "mkfs.ext4", "apt-get", "dpkg-deb", "berth-agent", "daemon", "data directory"}
	if !slices.Equal(names, want) {
		t.Errorf("checks %q, want %q", names, want)
	}
	if rep.OK != (len(failed) == 0) {
		t.Errorf("ok %v with failed needed checks %q", rep.OK, failed)
	}
	// The test binary has no berth-agent next to it: a needed check fails.
	if !slices.Contains(failed, "berth-agent") || code != 1 || !strings.Contains(errb, "berth-agent") {
		t.Errorf("exit %d, stderr %q, failed %q; want exit 1 naming berth-agent", code, errb, failed)
	}
}

// A daemon whose API answers while its session manager does not is
// frozen: doctor says so within the bound, with what to do, and fails.
func TestDoctorFrozenDaemon(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "berth.sock"))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"api":%q,"version":"v-frozen"}`, api.Version)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		select { // the Manager's lock is never free
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	start := time.Now()
	code, out, errb := run(t, dir, "", "doctor", "--json")
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("doctor took %s", d)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	i := slices.IndexFunc(rep.Checks, func(c Check) bool { return c.Name == "daemon" })
	if i < 0 {
		t.Fatalf("no daemon check: %s", out)
	}
	c := rep.Checks[i]
	if c.OK || !c.Needed || !strings.Contains(c.Detail, "v-frozen") || !strings.Contains(c.Detail, "has not answered") || !strings.Contains(c.Detail, "kill -QUIT") {
		t.Errorf("daemon check %+v", c)
	}
	if code != 1 || !strings.Contains(errb, "daemon") {
		t.Errorf("exit %d, stderr %q", code, errb)
	}
}
