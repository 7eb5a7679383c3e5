package app

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
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
	want := []string{"qemu", "image mini", "kvm", "tcg", "cloud-hypervisor", "mkfs.ext4", "apt-get", "dpkg-deb", "berth-agent", "data directory"}
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
