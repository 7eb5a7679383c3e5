package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/ui/sshd"
)

func pubKeyFile(t *testing.T, dir, comment string) (string, gossh.PublicKey) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(pk))) + " " + comment + "\n"
	path := filepath.Join(dir, comment+".pub")
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, pk
}

// run runs a berth command line with the local commands, data in dir.
func run(t *testing.T, dir string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb strings.Builder
	env := cli.Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb, Globals: &cli.Globals{Data: dir, Cache: t.TempDir()}}
	code = cli.Run(t.Context(), env, args, Commands("test")...)
	return code, out.String(), errb.String()
}

func TestSSHAddKey(t *testing.T) {
	g := cli.Globals{Data: t.TempDir()}
	keys := t.TempDir()
	alice, alicePK := pubKeyFile(t, keys, "alice")
	bob, _ := pubKeyFile(t, keys, "bob")
	carol, _ := pubKeyFile(t, keys, "carol")
	carolLine, _ := os.ReadFile(carol)

	for _, tc := range []struct {
		args   []string
		stdin  string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"add-key", "--role", "operator", alice}, stdout: "(alice) as operator to " + filepath.Join(g.Data, "ssh", "authorized_keys")},
		{args: []string{"add-key", bob, "--role=admin"}, stdout: "(bob) as admin"},
		{args: []string{"add-key", "-"}, stdin: string(carolLine), stdout: "(carol) as viewer"},
		{args: []string{"add-key", alice}, code: 1, stderr: "is already in"},
		{args: []string{"add-key", "--role", "root", alice}, code: 2, stderr: "--role root: use viewer, operator or admin"},
		{args: []string{"add-key", filepath.Join(keys, "missing.pub")}, code: 1, stderr: "no such file"},
		{args: []string{"add-key"}, code: 2, stderr: "missing KEYFILE"},
		{args: []string{"add-key", alice, bob}, code: 2, stderr: "unexpected argument"},
		{args: []string{"remove-key"}, code: 2, stderr: "unknown subcommand"},
		{args: nil, code: 2, stderr: "Usage: berth ssh add-key"},
	} {
		code, out, errb := run(t, g.Data, tc.stdin, append([]string{"ssh"}, tc.args...)...)
		if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errb, tc.stderr) {
			t.Errorf("berth ssh %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out, errb, tc.code, tc.stdout, tc.stderr)
		}
	}
	b, err := os.ReadFile(filepath.Join(g.Data, "ssh", "authorized_keys"))
	if err != nil {
		t.Fatal(err)
	}
	got, problems := sshd.ParseAuthorizedKeys(b)
	if len(got) != 3 || len(problems) != 0 {
		t.Fatalf("authorized_keys: %+v %q\n%s", got, problems, b)
	}
	want := []struct {
		role sshd.Role
		name string
	}{{sshd.Operator, "alice"}, {sshd.Admin, "bob"}, {sshd.Viewer, "carol"}}
	for i, w := range want {
		if got[i].Role != w.role || got[i].Name() != w.name {
			t.Errorf("key %d: %s %s, want %s %s", i, got[i].Role, got[i].Name(), w.role, w.name)
		}
	}
	if string(got[0].Key.Marshal()) != string(alicePK.Marshal()) {
		t.Error("alice's key differs")
	}
	if !strings.Contains(string(b), `berth-role="operator" ssh-ed25519 `) {
		t.Errorf("file format:\n%s", b)
	}
}

// TestSSHServerExtra: the daemon extra serves until its context ends,
// generating the host key once, and reports a bad address.
func TestSSHServerExtra(t *testing.T) {
	g := cli.Globals{Data: t.TempDir()}
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sshServer(g, "127.0.0.1:0", log, io.Discard)(ctx, nil) }()
	hostKey := filepath.Join(g.Data, "ssh", sshd.HostKeyFile)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(hostKey); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no host key generated")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the extra ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the extra did not end with its context")
	}
	err := sshServer(g, "256.0.0.1:http", log, io.Discard)(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "--ssh 256.0.0.1:http") {
		t.Errorf("bad address: %v", err)
	}
}
