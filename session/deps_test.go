package session

import (
	"os/exec"
	"strings"
	"testing"
)

// The contract imports only the standard library, and the front ends link
// none of the engine's parts (badger, the store, the VMM drivers, the
// engine itself): only the package that wires the daemon in (ui/app) and
// the daemon (session/daemon) may.
func TestDependenciesPointOneWay(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list dependencies")
	}
	list := func(pkg string) []string {
		t.Helper()
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, dep := range list("github.com/berthvm/berth/session") {
		if dep != "github.com/berthvm/berth/session" {
			t.Errorf("the contract imports %s; it may import only the standard library", dep)
		}
	}
	forbidden := []string{"github.com/dgraph-io/badger", "github.com/berthvm/berth/store", "github.com/berthvm/berth/vmm", "github.com/berthvm/berth/session/engine"}
	// The fleet links etcd and none of the engine; front ends reach the
	// fleet through the contract (session.HostLister), linking no etcd.
	for _, dep := range list("github.com/berthvm/berth/session/fleet/...") {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the fleet links %s", dep)
			}
		}
	}
	// berth-host links etcd's client, not its server: the server's
	// start-up would cost every command about 5 ms (berth-etcd has it).
	for _, dep := range list("github.com/berthvm/berth/ui/app/cmd/berth-host") {
		if strings.HasPrefix(dep, "go.etcd.io/etcd/server/") || dep == "github.com/berthvm/berth/session/fleet/member" {
			t.Errorf("berth-host links %s; etcd's server belongs in berth-etcd", dep)
		}
	}
	forbidden = append(forbidden, "go.etcd.io/", "github.com/berthvm/berth/session/fleet")
	// berth runs the client commands and links no daemon: the daemon's
	// packages cost every command's start about 7 ms, the MCP server's
	// about 1 ms (berth-host has them).
	for _, dep := range list("github.com/berthvm/berth") {
		for _, f := range append(forbidden, "github.com/berthvm/berth/session/daemon", "gvisor.dev/", "github.com/prometheus/", "github.com/berthvm/berth/ui/app",
			"github.com/berthvm/berth/ui/mcpserver", "github.com/modelcontextprotocol/") {
			// pki (the standard library's crypto alone) makes the client
			// certificate that reaches a fleet host with --host.
			if strings.HasPrefix(dep, f) && dep != "github.com/berthvm/berth/ui/app/local" && dep != "github.com/berthvm/berth/session/fleet/pki" {
				t.Errorf("berth links %s; the daemon's packages belong in berth-host", dep)
			}
		}
	}
	for _, fe := range []string{
		"github.com/berthvm/berth/ui", "github.com/berthvm/berth/ui/cli", "github.com/berthvm/berth/ui/sshd",
		"github.com/berthvm/berth/ui/mcpserver", "github.com/berthvm/berth/ui/components/...", "github.com/berthvm/berth/session/api",
	} {
		for _, dep := range list(fe) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					t.Errorf("front end %s links %s", fe, dep)
				}
			}
		}
	}
}
