package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/app"
	"github.com/berthvm/berth/ui/cli"
)

// tc is one CLI call and what it must print and return. Empty want
// strings are not checked unless exact is set; "~" prefixes a substring
// match.
type tc struct {
	name   string
	args   []string
	env    cli.Env
	code   int
	stdout string
	stderr string
}

func (tt tc) check(t *testing.T, r result) {
	t.Helper()
	if r.code != tt.code {
		t.Errorf("berth %s: exit %d, want %d (stderr %q)", strings.Join(tt.args, " "), r.code, tt.code, r.stderr)
	}
	match(t, "stdout", r.stdout, tt.stdout)
	match(t, "stderr", r.stderr, tt.stderr)
}

// match checks got against want: "" means empty, "~x" means contains x,
// "*" means anything.
func match(t *testing.T, what, got, want string) {
	t.Helper()
	switch {
	case want == "*":
	case strings.HasPrefix(want, "~"):
		if !strings.Contains(got, want[1:]) {
			t.Errorf("%s = %q, want it to contain %q", what, got, want[1:])
		}
	case got != want:
		t.Errorf("%s = %q, want %q", what, got, want)
	}
	if what == "stderr" && strings.Count(got, "\n") > 1 && strings.HasPrefix(got, "berth:") {
		t.Errorf("stderr has %d lines, want one: %q", strings.Count(got, "\n"), got)
	}
}

func runAll(t *testing.T, w *world, tests []tc) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, w.run(t.Context(), tt.env, tt.args...))
		})
	}
}

func TestUsageErrors(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	runAll(t, w, []tc{
		{name: "no args", args: nil, code: 2, stderr: "berth: missing command (run 'berth help' for the list)\n"},
		{name: "unknown command", args: []string{"frob"}, code: 2,
			stderr: "berth: unknown command \"frob\" (run 'berth help' for the list)\n"},
		{name: "unknown help topic", args: []string{"help", "frob"}, code: 2, stderr: "~unknown command \"frob\""},
		{name: "missing name", args: []string{"create"}, code: 2,
			stderr: "berth: create: missing NAME (usage: berth create NAME [flags]; see 'berth create --help')\n"},
		{name: "extra arg", args: []string{"pause", "demo", "other"}, code: 2,
			stderr: "berth: pause: unexpected argument \"other\" (usage: berth pause NAME; see 'berth pause --help')\n"},
		{name: "unknown flag", args: []string{"ls", "--bogus"}, code: 2,
			stderr: "berth: ls: flag provided but not defined: -bogus (usage: berth ls [flags]; see 'berth ls --help')\n"},
		{name: "exec missing command", args: []string{"exec", "demo"}, code: 2,
			stderr: "berth: exec: missing CMD (usage: berth exec NAME [flags] -- CMD [ARGS...]; see 'berth exec --help')\n"},
		{name: "bad timeout", args: []string{"exec", "demo", "--timeout", "soon", "--", "true"}, code: 2,
			stderr: "~invalid value \"soon\" for flag -timeout"},
		{name: "bad env", args: []string{"exec", "demo", "--env", "NOEQUALS", "--", "true"}, code: 2,
			stderr: "~invalid value \"NOEQUALS\" for flag -env: want NAME=VALUE"},
		{name: "bad stream", args: []string{"logs", "demo", "--stream", "both"}, code: 2,
			stderr: "~want stdout or stderr"},
		{name: "bad vmm", args: []string{"create", "x", "--vmm", "firecracker"}, code: 2,
			stderr: "~want qemu or cloud-hypervisor"},
		// An explicit --cpus is checked by the daemon's own rule, 0 included
		// (unset, it takes the daemon's default).
		{name: "zero cpus", args: []string{"create", "x", "--cpus", "0"}, code: 2, stderr: "~--cpus 0: use 1 to 64"},
		{name: "negative cpus", args: []string{"create", "x", "--cpus", "-2"}, code: 2, stderr: "~--cpus -2: use 1 to 64"},
		{name: "too many cpus", args: []string{"create", "x", "--cpus", "999"}, code: 2, stderr: "~--cpus 999: use 1 to 64"},
	})
}

func TestInvalidNames(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	for _, name := range []string{"Demo", "_demo", "démo", "de_mo", "de mo", "a/b", strings.Repeat("x", 64), ""} {
		for _, cmd := range []string{"create", "info", "pause", "exec", "files"} {
			args := []string{cmd, name}
			if cmd == "exec" {
				args = append(args, "true")
			}
			tc{name: cmd + " " + name, args: args, code: 2,
				stderr: "berth: invalid session name \"" + name + "\": use 1-63 lowercase letters, digits and dashes, starting with a letter or digit\n",
			}.check(t, w.run(t.Context(), cli.Env{}, args...))
		}
	}
	w.sh(t, "create", strings.Repeat("x", 63))
	w.sh(t, "create", "0-a")
}

func TestSizes(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	runAll(t, w, []tc{
		{name: "512M", args: []string{"create", "a", "--memory", "512M"}, stdout: "~512 MiB memory"},
		{name: "1.5G", args: []string{"create", "b", "--memory", "1.5G", "--disk", "1.5G"}, stdout: "~1.5 GiB memory, 1.5 GiB disk"},
		{name: "K", args: []string{"create", "c", "--memory", "131072K", "--disk", "4GiB"}, stdout: "~128 MiB memory, 4.0 GiB disk"},
		{name: "plain bytes", args: []string{"create", "d", "--disk", "17179869184"}, stdout: "~16 GiB disk"},
		{name: "lowercase", args: []string{"create", "e", "--memory", "2g"}, stdout: "~2.0 GiB memory"},
		{name: "unit junk", args: []string{"create", "x", "--memory", "12Q"}, code: 2,
			stderr: "berth: create: invalid value \"12Q\" for flag -memory: want a number with an optional K, M, G or T suffix, like 512M or 1.5G (usage: berth create NAME [flags]; see 'berth create --help')\n"},
		{name: "negative", args: []string{"create", "x", "--disk", "-4G"}, code: 2, stderr: "~invalid value \"-4G\" for flag -disk"},
		{name: "zero", args: []string{"create", "x", "--disk", "0"}, code: 2, stderr: "~want a size above zero"},
		{name: "fraction of a byte", args: []string{"create", "x", "--disk", "1.5"}, code: 2, stderr: "~1.5 is not a whole number of bytes"},
		{name: "empty", args: []string{"create", "x", "--memory", ""}, code: 2, stderr: "~invalid value \"\" for flag -memory"},
		{name: "not whole MiB", args: []string{"create", "x", "--memory", "1000K"}, code: 2, stderr: "~want a whole number of MiB"},
		{name: "bare memory is bytes", args: []string{"create", "x", "--memory", "512"}, code: 2,
			stderr: "~512 means 512 bytes; want a whole number of MiB (did you mean 512M?)"},
		{name: "too small for the service", args: []string{"create", "x", "--memory", "1M"}, code: 1,
			stderr: "berth: --memory 1M is below the 128M a guest needs\n"},
	})
}

func TestSessionCommands(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	runAll(t, w, []tc{
		{name: "create", args: []string{"create", "demo"},
			stdout: "created demo: running, 1 CPU, 512 MiB memory, 4.0 GiB disk, image mini on qemu\n"},
		{name: "create flags after name", args: []string{"create", "big", "--cpus", "2", "--memory", "2G", "--disk", "8G", "--vmm", "qemu"},
			stdout: "created big: running, 2 CPUs, 2.0 GiB memory, 8.0 GiB disk, image mini on qemu\n"},
		{name: "duplicate", args: []string{"create", "demo"}, code: 1,
			stderr: "berth: session \"demo\" already exists (pick another name or delete it first): already exists\n"},
		{name: "unknown image", args: []string{"create", "x", "--image", "huge"}, code: 1,
			stderr: "berth: --image \"huge\" is not built (build it from a recipe, or list the images there are)\n"},
		{name: "info unknown", args: []string{"info", "nope"}, code: 1, stderr: "berth: session \"nope\": not found\n"},
		{name: "pause", args: []string{"pause", "demo"}, stdout: "demo: paused\n"},
		{name: "pause paused", args: []string{"pause", "demo"}, code: 1,
			stderr: "berth: cannot pause session \"demo\": it is already paused: invalid state\n"},
		{name: "flush paused", args: []string{"flush", "demo"}, code: 1,
			stderr: "berth: cannot flush session \"demo\": it is paused (resume it first): invalid state\n"},
		{name: "resume", args: []string{"resume", "demo"}, stdout: "demo: running\n"},
		{name: "resume running", args: []string{"resume", "demo"}, code: 1,
			stderr: "berth: cannot resume session \"demo\": it is already running: invalid state\n"},
		{name: "stop", args: []string{"stop", "demo"}, stdout: "demo: stopped\n"},
		{name: "stop stopped", args: []string{"stop", "demo"}, code: 1,
			stderr: "berth: cannot stop session \"demo\": it is already stopped: invalid state\n"},
		{name: "pause stopped", args: []string{"pause", "demo"}, code: 1,
			stderr: "berth: cannot pause session \"demo\": it is stopped (start it first): invalid state\n"},
		{name: "exec stopped", args: []string{"exec", "demo", "true"}, code: 1,
			stderr: "berth: cannot exec in session \"demo\": it is stopped (start it first): invalid state\n"},
		{name: "start", args: []string{"start", "demo"}, stdout: "demo: running\n"},
		{name: "start running", args: []string{"start", "demo"}, code: 1, stderr: "berth: cannot start session \"demo\": it is already running: invalid state\n"},
		{name: "pause unknown", args: []string{"pause", "nope"}, code: 1, stderr: "berth: session \"nope\": not found\n"},
	})

	t.Run("flush", func(t *testing.T) {
		w.fake.SetDirty("demo", 3<<20)
		tc{args: []string{"flush", "demo"}, stdout: "demo: flushed 3145728 bytes (3.0 MiB) in 3ms\n"}.
			check(t, w.run(t.Context(), cli.Env{}, "flush", "demo"))
	})
	t.Run("ls", func(t *testing.T) {
		w.fake.SetDirty("big", 1536)
		w.sh(t, "put", "demo", "-", "notes.txt")
		r := w.run(t.Context(), cli.Env{}, "ls")
		golden(t, "ls", r.stdout)
		r = w.run(t.Context(), cli.Env{}, "ls", "--json")
		golden(t, "ls-json", r.stdout)
		var list []session.Session
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 {
			t.Errorf("ls --json: %v, %d sessions", err, len(list))
		}
	})
	t.Run("info", func(t *testing.T) {
		golden(t, "info", w.sh(t, "info", "demo"))
		var s session.Session
		if err := json.Unmarshal([]byte(w.sh(t, "info", "demo", "--json")), &s); err != nil || s.Name != "demo" {
			t.Errorf("info --json: %v, %+v", err, s)
		}
	})
	t.Run("events", func(t *testing.T) {
		golden(t, "events", w.sh(t, "events", "demo"))
		if out := w.sh(t, "events", "demo", "-n", "2"); strings.Count(out, "\n") != 3 {
			t.Errorf("events -n 2 printed:\n%s", out)
		}
	})
}

func TestLsEmpty(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	tc{args: []string{"ls"}, stderr: "no sessions; create one with 'berth create NAME'\n"}.check(t, w.run(t.Context(), cli.Env{}, "ls"))
	tc{args: []string{"ls", "--json"}, stdout: "[]\n"}.check(t, w.run(t.Context(), cli.Env{}, "ls", "--json"))
}

func TestDelete(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	tty := cli.Env{StdinTTY: true}
	runAll(t, w, []tc{
		{name: "no terminal, no --yes", args: []string{"delete", "demo"}, code: 2,
			stderr: "berth: delete: refusing to delete \"demo\" without confirmation: stdin is not a terminal; add --yes (usage: berth delete NAME [flags]; see 'berth delete --help')\n"},
		{name: "wrong name typed", args: []string{"delete", "demo"}, code: 1,
			env:    cli.Env{StdinTTY: true, Stdin: strings.NewReader("dmeo\n")},
			stderr: "~berth: delete demo: confirmation \"dmeo\" does not match; nothing was deleted\n"},
		{name: "no answer", args: []string{"delete", "demo"}, code: 1, env: tty, stderr: "~nothing was deleted"},
		{name: "still there", args: []string{"info", "demo"}, stdout: "*", stderr: ""},
		{name: "confirmed", args: []string{"delete", "demo"}, env: cli.Env{StdinTTY: true, Stdin: strings.NewReader("demo\n")},
			stdout: "deleted demo\n", stderr: "~Type the session name to confirm: "},
		{name: "gone", args: []string{"info", "demo"}, code: 1, stderr: "berth: session \"demo\": not found\n"},
		{name: "unknown", args: []string{"delete", "nope", "--yes"}, code: 1, stderr: "berth: session \"nope\": not found\n"},
	})
	w.sh(t, "create", "again")
	tc{args: []string{"delete", "again", "--yes"}, stdout: "deleted again\n"}.check(t, w.run(t.Context(), cli.Env{}, "delete", "--yes", "again"))
}

func TestUnreachableDaemon(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	gone := api.Dial(filepath.Join(t.TempDir(), "none.sock"))
	defer gone.Close()
	env := cli.Env{Connect: func(context.Context) (session.Service, error) { return gone, nil }}
	r := w.run(t.Context(), env, "ls")
	tc{args: []string{"ls"}, code: 1, stderr: "~berth: cannot reach the berth daemon at "}.check(t, r)
	if !strings.Contains(r.stderr, "berth serve") {
		t.Errorf("stderr %q does not say what to do", r.stderr)
	}
}

// TestHelp: the overview, and every command's --help, come from the one
// table: locally the built-in commands plus ui/app's, over SSH (no extra
// commands, no global flags) the built-in ones alone.
func TestHelp(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	local := func(args ...string) result {
		var out, errOut bytes.Buffer
		env := cli.Env{Stdout: &out, Stderr: &errOut, Globals: &cli.Globals{Data: t.TempDir()}}
		code := cli.Run(t.Context(), env, args, app.Commands("test")...)
		return result{out.String(), errOut.String(), code}
	}
	r := local("help")
	golden(t, "help", r.stdout)
	if r2 := local("--help"); r2.stdout != r.stdout || r2.code != 0 {
		t.Errorf("--help differs from help")
	}
	remote := w.run(t.Context(), cli.Env{}, "help")
	golden(t, "help-remote", remote.stdout)
	if strings.Contains(remote.stdout, "serve") || strings.Contains(remote.stdout, "--data") {
		t.Errorf("the help without the local commands lists serve or --data:\n%s", remote.stdout)
	}
	for _, name := range []string{"create", "ls", "info", "pause", "resume", "stop", "start", "flush", "delete", "events", "stats",
		"exec", "shell", "logs", "ps", "cancel", "files", "cat", "put", "get", "rm", "mkdir",
		"serve", "image build", "image import", "image commit", "image export", "image ls", "image rm", "host ls", "etcd", "fleet init", "doctor", "ssh add-key", "version",
		"run start", "run end", "runs", "schedule add", "schedule ls", "schedule rm", "mcp"} {
		t.Run(name, func(t *testing.T) {
			args := strings.Fields(name)
			r := local(append(args, "--help")...)
			if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Example:\n  berth "+name) {
				t.Errorf("berth %s --help: exit %d, stderr %q, stdout without an example:\n%s", name, r.code, r.stderr, r.stdout)
			}
			golden(t, "help-"+strings.Join(args, "-"), r.stdout)
			if h := local(append([]string{"help"}, args...)...); h.stdout != r.stdout || h.code != 0 {
				t.Errorf("berth help %s differs from berth %s --help", name, name)
			}
		})
	}
	// Over SSH the local commands are unknown.
	for _, name := range []string{"serve", "image", "doctor", "ssh", "version", "--version"} {
		if r := w.run(t.Context(), cli.Env{}, name); r.code != 2 || !strings.HasPrefix(r.stderr, "berth: unknown command") {
			t.Errorf("berth %s without the local commands: exit %d, stderr %q; want 2, unknown command", name, r.code, r.stderr)
		}
	}
}

// TestGroups: a group of commands named without one of them ("berth
// ssh") shows their help, asked for or as a usage error.
func TestGroups(t *testing.T) {
	for _, tt := range []tc{
		{name: "bare", args: []string{"ssh"}, code: 2, stdout: "", stderr: "~Usage: berth ssh add-key [--role viewer|operator|admin] KEYFILE\n"},
		{name: "help", args: []string{"ssh", "help"}, stdout: "~Usage: berth ssh add-key", stderr: ""},
		{name: "--help", args: []string{"image", "--help"}, stdout: "~Usage: berth image build [NAME] [--recipe FILE]", stderr: ""},
		{name: "help group", args: []string{"help", "image"}, stdout: "~Usage: berth image build", stderr: ""},
		{name: "unknown", args: []string{"ssh", "remove-key"}, code: 2,
			stderr: "berth: ssh: unknown subcommand \"remove-key\" (usage: berth ssh add-key KEYFILE [flags]; see 'berth help ssh')\n"},
		{name: "image args", args: []string{"image", "build", "mini", "extra"}, code: 2,
			stderr: "berth: image build: unexpected argument \"extra\" (usage: berth image build [NAME] [flags]; see 'berth image build --help')\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := cli.Env{Stdout: &out, Stderr: &errOut, Globals: &cli.Globals{Data: t.TempDir()}}
			code := cli.Run(t.Context(), env, tt.args, app.Commands("test")...)
			tt.check(t, result{out.String(), errOut.String(), code})
		})
	}
}

// TestImageExportArgs: an export with nowhere to go, or a path it
// cannot write, is refused before the daemon is asked (none runs here).
func TestImageExportArgs(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []tc{
		{name: "no -o", args: []string{"image", "export", "app"}, code: 2, stderr: "~-o FILE is required"},
		{name: "unwritable", args: []string{"image", "export", "app", "-o", filepath.Join(dir, "no", "such", "dir", "app.tar")}, code: 1, stderr: "~cannot write " + filepath.Join(dir, "no", "such", "dir", "app.tar") + ": no such file or directory"},
		{name: "a directory", args: []string{"image", "export", "app", "-o", dir}, code: 1, stderr: "~is a directory"},
		{name: "bad name", args: []string{"image", "export", "Bad_Name", "-o", filepath.Join(dir, "x.tar")}, code: 1, stderr: "~Bad_Name"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := cli.Env{Stdout: &out, Stderr: &errOut, Globals: &cli.Globals{Data: filepath.Join(dir, "data")}}
			code := cli.Run(t.Context(), env, tt.args, app.Commands("test")...)
			tt.check(t, result{out.String(), errOut.String(), code})
		})
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused export left %v behind", ents)
	}
}

// TestGlobals: the global flags, before the command, reach the commands;
// a bad one is a usage error.
func TestGlobals(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want cli.Globals
		rest string
		code int
	}{
		{args: []string{"version"}, want: cli.Globals{Data: "/default", Cache: "/cache"}},
		{args: []string{"--data", dir, "--readonly", "version"}, want: cli.Globals{Data: dir, Cache: "/cache", ReadOnly: true}},
		{args: []string{"--data=rel", "--cache", "/c", "--version"}, want: cli.Globals{Data: filepath.Join(must(os.Getwd()), "rel"), Cache: "/c"}},
		{args: []string{"-readonly", "version"}, want: cli.Globals{Data: "/default", Cache: "/cache", ReadOnly: true}},
		{args: []string{"--data"}, code: 2, rest: "berth: --data needs a directory (run 'berth help' for the global flags)\n"},
		{args: []string{"--bogus", "version"}, code: 2, rest: "berth: unknown command \"--bogus\" (run 'berth help' for the list)\n"},
	} {
		var out, errOut bytes.Buffer
		g := &cli.Globals{Data: "/default", Cache: "/cache"}
		code := cli.Run(t.Context(), cli.Env{Stdout: &out, Stderr: &errOut, Globals: g}, tt.args, app.Commands("test")...)
		if code != tt.code || errOut.String() != tt.rest {
			t.Errorf("berth %q: exit %d, stderr %q; want %d, %q", tt.args, code, errOut.String(), tt.code, tt.rest)
		}
		if code == 0 && (*g != tt.want || out.String() != "berth test\n") {
			t.Errorf("berth %q: globals %+v, stdout %q; want %+v, \"berth test\\n\"", tt.args, *g, out.String(), tt.want)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestFiles(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	dir := t.TempDir()
	local := filepath.Join(dir, "hello.txt")
	os.WriteFile(local, []byte("hello\n"), 0o644)
	runAll(t, w, []tc{
		{name: "put", args: []string{"put", "demo", local}, stdout: "wrote 6 bytes (6 B) to demo:/workspace/hello.txt, durably\n"},
		{name: "mkdir", args: []string{"mkdir", "demo", "src/pkg"}},
		{name: "put into dir", args: []string{"put", "demo", local, "src"}, stdout: "wrote 6 bytes (6 B) to demo:/workspace/src/hello.txt, durably\n"},
		{name: "put stdin", args: []string{"put", "demo", "-", "/workspace/src/pkg/in.txt"}, env: cli.Env{Stdin: strings.NewReader("from stdin")},
			stdout: "wrote 10 bytes (10 B) to demo:/workspace/src/pkg/in.txt, durably\n"},
		{name: "put stdin no remote", args: []string{"put", "demo", "-"}, code: 2, stderr: "~reading stdin needs a REMOTE path"},
		{name: "put missing local", args: []string{"put", "demo", filepath.Join(dir, "nope")}, code: 1, stderr: "~no such file or directory"},
		{name: "put local dir", args: []string{"put", "demo", dir}, code: 1, stderr: "~is a directory; put copies one file"},
		{name: "put no parent", args: []string{"put", "demo", local, "no/such/dir/x"}, code: 1, stderr: "~not found"},
		{name: "put escape", args: []string{"put", "demo", local, "../etc/x"}, code: 1, stderr: "berth: path \"../etc/x\" is outside /workspace\n"},
		{name: "put no local files", args: []string{"put", "demo", local}, env: cli.Env{NoLocalFiles: true}, code: 2, stderr: "~local files are not reachable here"},
		{name: "files", args: []string{"files", "demo"}, stdout: "hello.txt\nsrc/\n"},
		{name: "files dir", args: []string{"files", "demo", "src"}, stdout: "hello.txt\npkg/\n"},
		{name: "files file", args: []string{"files", "demo", "src/pkg/in.txt"}, stdout: "in.txt\n"},
		{name: "files -l", args: []string{"files", "demo", "-l"},
			stdout: "MODE        SIZE  MODIFIED          NAME\n-rw-r--r--  6 B   2026-03-14 09:00  hello.txt\ndrwxr-xr-x  -     2026-03-14 09:00  src/\n"},
		{name: "files missing", args: []string{"files", "demo", "nope"}, code: 1, stderr: "berth: /workspace/nope: not found\n"},
		{name: "cat", args: []string{"cat", "demo", "src/pkg/in.txt"}, stdout: "from stdin"},
		{name: "cat dir", args: []string{"cat", "demo", "src"}, code: 1, stderr: "berth: read /workspace/src: is a directory: invalid argument\n"},
		{name: "cat missing", args: []string{"cat", "demo", "nope"}, code: 1, stderr: "berth: /workspace/nope: not found\n"},
		{name: "get stdout", args: []string{"get", "demo", "hello.txt", "-"}, stdout: "hello\n"},
		{name: "get dir", args: []string{"get", "demo", "src"}, code: 1, stderr: "~is a directory; get copies one file"},
		{name: "get missing", args: []string{"get", "demo", "nope", "-"}, code: 1, stderr: "berth: /workspace/nope: not found\n"},
		{name: "get no local files", args: []string{"get", "demo", "hello.txt", filepath.Join(dir, "x")}, env: cli.Env{NoLocalFiles: true}, code: 2,
			stderr: "~local files are not reachable here"},
		{name: "rm dir without -r", args: []string{"rm", "demo", "src"}, code: 1,
			stderr: "berth: rm: /workspace/src is a directory; add -r to remove it and everything in it\n"},
		{name: "rm -r", args: []string{"rm", "demo", "src", "-r"}},
		{name: "rm file", args: []string{"rm", "demo", "hello.txt"}},
		{name: "rm missing", args: []string{"rm", "demo", "hello.txt"}, code: 1, stderr: "berth: /workspace/hello.txt: not found\n"},
		{name: "files empty", args: []string{"files", "demo"}, stdout: ""},
	})
	t.Run("get to file", func(t *testing.T) {
		w.sh(t, "put", "demo", local, "copy.txt")
		out := filepath.Join(dir, "out")
		os.Mkdir(out, 0o755)
		tc{stdout: "wrote 6 bytes (6 B) to " + filepath.Join(out, "copy.txt") + "\n"}.check(t, w.run(t.Context(), cli.Env{}, "get", "demo", "copy.txt", out))
		if b, err := os.ReadFile(filepath.Join(out, "copy.txt")); err != nil || string(b) != "hello\n" {
			t.Errorf("got file = %q, %v", b, err)
		}
		entries, _ := os.ReadDir(out)
		if len(entries) != 1 {
			t.Errorf("get left %d files in %s, want 1 (no temp files)", len(entries), out)
		}
	})
}

func TestPutProgress(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	big := filepath.Join(t.TempDir(), "big.bin")
	os.WriteFile(big, make([]byte, 9<<20), 0o644)
	r := w.run(t.Context(), cli.Env{StderrTTY: true}, "put", "demo", big)
	tc{stdout: "wrote 9437184 bytes (9.0 MiB) to demo:/workspace/big.bin, durably\n",
		stderr: "~put big.bin: 9.0 MiB of 9.0 MiB (100%)"}.check(t, r)
	r = w.run(t.Context(), cli.Env{}, "put", "demo", big)
	tc{stdout: "*", stderr: ""}.check(t, r)
	r = w.run(t.Context(), cli.Env{StderrTTY: true}, "get", "demo", "big.bin", "-")
	if len(r.stdout) != 9<<20 || !strings.Contains(r.stderr, "get big.bin: 9.0 MiB of 9.0 MiB (100%)") {
		t.Errorf("get: %d bytes, stderr %q", len(r.stdout), r.stderr)
	}
}

func TestExec(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	runAll(t, w, []tc{
		{name: "streams and exit code", args: []string{"exec", "demo", "--", "sh", "-c", "echo out; echo err >&2; exit 3"},
			code: 3, stdout: "out\n", stderr: "err\n"},
		{name: "without --", args: []string{"exec", "demo", "echo", "-n", "hi there"}, stdout: "hi there"},
		{name: "flags before name", args: []string{"exec", "--cwd", "/tmp", "demo", "pwd"}, stdout: "/tmp\n"},
		{name: "stdin", args: []string{"exec", "demo", "cat"}, env: cli.Env{Stdin: strings.NewReader("line 1\nline 2\n")},
			stdout: "line 1\nline 2\n"},
		{name: "env", args: []string{"exec", "demo", "--env", "A=1", "--env", "B=x=y", "--", "sh", "-c", "printenv A; printenv B"},
			stdout: "1\nx=y\n"},
		{name: "signal", args: []string{"exec", "demo", "--", "sh", "-c", "kill -TERM $$"}, code: 143,
			stderr: "berth: e0006 was killed by SIGTERM\n"},
		{name: "timeout", args: []string{"exec", "demo", "--timeout", "100ms", "--", "sleep", "10"}, code: 124,
			stderr: "berth: e0007 timed out and was killed; changes it made so far remain\n"},
		{name: "not found", args: []string{"exec", "demo", "--", "frobnicate"}, code: 127,
			stderr: "berth: e0008 could not start: exec \"frobnicate\": executable file not found in $PATH\n"},
		{name: "unknown session", args: []string{"exec", "nope", "true"}, code: 1, stderr: "berth: session \"nope\": not found\n"},
		{name: "-t without terminal", args: []string{"exec", "demo", "-t", "--", "sh"}, code: 2, stderr: "~-t needs a terminal on stdin"},
		{name: "shell without terminal", args: []string{"shell", "demo"}, code: 2, stderr: "~needs a terminal on stdin"},
		{name: "detach", args: []string{"exec", "demo", "--detach", "--", "sleep", "30"}, stdout: "e0009\n"},
	})
	t.Run("ps", func(t *testing.T) {
		r := w.run(t.Context(), cli.Env{}, "ps", "demo")
		tc{stdout: "~e0009  running  -"}.check(t, r)
		if strings.Contains(r.stdout, "e0001") {
			t.Errorf("ps without --all shows finished commands:\n%s", r.stdout)
		}
		w.client.Cancel(t.Context(), "e0009")
		waitDone(t, w, "e0009")
		golden(t, "ps-all", w.sh(t, "ps", "demo", "--all"))
		golden(t, "ps-json", w.sh(t, "ps", "demo", "--all", "--json"))
		tc{stderr: "no running commands (--all shows finished ones)\n"}.check(t, w.run(t.Context(), cli.Env{}, "ps", "demo"))
		tc{code: 1, stderr: "berth: session \"nope\": not found\n"}.check(t, w.run(t.Context(), cli.Env{}, "ps", "nope"))
	})
	// A command whose stdin here is /dev/null gets none to read from
	// (not even what Stdin would give): nothing is forwarded.
	t.Run("stdin /dev/null", func(t *testing.T) {
		r := w.run(t.Context(), cli.Env{StdinNull: true, Stdin: strings.NewReader("not forwarded")}, "exec", "demo", "cat")
		tc{stdout: ""}.check(t, r)
	})
}

func waitDone(t *testing.T, w *world, id string) session.Execution {
	t.Helper()
	for range 200 {
		x, err := w.client.Execution(t.Context(), id)
		if err == nil && x.State.Done() {
			return x
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not end", id)
	return session.Execution{}
}

// TestExecInterrupt cancels Run's context (Ctrl-C) mid-command: the
// command is cancelled in the guest and Run exits 130.
func TestExecInterrupt(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	ctx, interrupt := context.WithCancel(t.Context())
	done := make(chan result)
	go func() { done <- w.run(ctx, cli.Env{}, "exec", "demo", "--", "sh", "-c", "echo started; sleep 30") }()
	for range 500 {
		if list, _ := w.client.Executions(t.Context(), "demo", false); len(list) == 1 {
			if page, _ := w.client.Output(t.Context(), list[0].ID, 1, 0); len(page.Chunks) > 0 {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	interrupt()
	select {
	case r := <-done:
		tc{code: 130, stdout: "started\n", stderr: "berth: e0001 was cancelled; changes it made so far remain\n"}.check(t, r)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10 s after the interrupt")
	}
	if x := waitDone(t, w, "e0001"); x.State != session.ExecCancelled {
		t.Errorf("state = %s, want cancelled", x.State)
	}
}

func TestTerminal(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	var raw, restored int
	sizes := make(chan cli.TermSize, 1)
	env := cli.Env{
		StdinTTY: true, StdoutTTY: true, Size: cli.TermSize{Rows: 30, Cols: 100},
		MakeRaw: func() (func(), error) { raw++; return func() { restored++ }, nil },
	}
	r := w.run(t.Context(), env, "exec", "demo", "-t", "--", "stty", "size")
	tc{stdout: "30 100\n"}.check(t, r)
	if raw != 1 || restored != 1 {
		t.Errorf("raw mode set %d, restored %d times; want 1 and 1", raw, restored)
	}

	// The shell reads its commands from stdin; a resize arrives before.
	sizes <- cli.TermSize{Rows: 50, Cols: 132}
	env.SizeChanges = func(context.Context) <-chan cli.TermSize { return sizes }
	env.Stdin = &slowReader{r: strings.NewReader("echo hello\nstty size\nexit 4\n"), delay: 200 * time.Millisecond}
	r = w.run(t.Context(), env, "shell", "demo")
	tc{code: 4, stdout: "~hello\n"}.check(t, r)
	if !strings.Contains(r.stdout, "50 132") {
		t.Errorf("shell after resize: stdout %q, want the new size", r.stdout)
	}
	x := waitDone(t, w, "e0002")
	if !x.TTY || x.Argv[0] != "sh" || x.Cwd != "/workspace" || x.By != "cli" {
		t.Errorf("shell record = %+v", x)
	}
}

// slowReader waits before its first read, so that other input (a resize)
// lands first.
type slowReader struct {
	r     *strings.Reader
	delay time.Duration
}

func (s *slowReader) Read(b []byte) (int, error) {
	if s.delay > 0 {
		time.Sleep(s.delay)
		s.delay = 0
	}
	return s.r.Read(b)
}

func TestLogs(t *testing.T) {
	w := newWorld(t, sessiontest.Options{OutputRetention: 64 << 10})
	w.sh(t, "create", "demo")
	runAll(t, w, []tc{
		{name: "no commands yet", args: []string{"logs", "demo"}, code: 1,
			stderr: "berth: session demo has no recorded commands yet; run one with 'berth exec demo -- CMD'\n"},
		{name: "run", args: []string{"exec", "demo", "--", "sh", "-c", "echo one; echo two >&2; echo three"},
			stdout: "one\nthree\n", stderr: "two\n"},
		{name: "latest", args: []string{"logs", "demo"}, stdout: "one\nthree\n", stderr: "two\n"},
		{name: "by id", args: []string{"logs", "demo", "e0001"}, stdout: "one\nthree\n", stderr: "two\n"},
		{name: "stderr only", args: []string{"logs", "demo", "e0001", "--stream", "stderr"}, stderr: "two\n"},
		{name: "since", args: []string{"logs", "demo", "--since", "2"}, stdout: "three\n", stderr: "two\n"},
		{name: "unknown exec", args: []string{"logs", "demo", "e9999"}, code: 1, stderr: "berth: execution \"e9999\": not found\n"},
		{name: "big", args: []string{"exec", "demo", "--", "head", "-c", "200000", "/dev/zero"}, stdout: "*"},
	})
	t.Run("trimmed", func(t *testing.T) {
		r := w.run(t.Context(), cli.Env{}, "logs", "demo")
		if !strings.HasPrefix(r.stderr, "berth: ") || !strings.HasSuffix(r.stderr, " bytes of output were trimmed by retention\n") {
			t.Errorf("stderr = %q, want the trimmed gap", r.stderr)
		}
		if r.code != 0 || len(r.stdout) == 0 || len(r.stdout) >= 200000 {
			t.Errorf("exit %d, %d bytes replayed", r.code, len(r.stdout))
		}
	})
	t.Run("other session's exec", func(t *testing.T) {
		w.sh(t, "create", "other")
		tc{code: 1, stderr: "berth: execution e0001 belongs to session demo, not other\n"}.
			check(t, w.run(t.Context(), cli.Env{}, "logs", "other", "e0001"))
	})
	t.Run("follow", func(t *testing.T) {
		id := strings.TrimSpace(w.sh(t, "exec", "demo", "--detach", "--", "sh", "-c", "echo first; sleep 0.3; echo second >&2; echo last"))
		r := w.run(t.Context(), cli.Env{}, "logs", "demo", id, "-f")
		tc{stdout: "first\nlast\n", stderr: "second\n"}.check(t, r)
	})
}

// cancel kills a detached command through the service call the TUI's K
// makes, and says how it ended.
func TestCancel(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	w.sh(t, "create", "other")
	id := strings.TrimSpace(w.sh(t, "exec", "demo", "--detach", "--", "sleep", "30"))
	runAll(t, w, []tc{
		{name: "another session's", args: []string{"cancel", "other", id}, code: 1,
			stderr: "berth: execution " + id + " belongs to session demo, not other\n"},
		{name: "unknown", args: []string{"cancel", "demo", "e9999"}, code: 1, stderr: "berth: execution \"e9999\": not found\n"},
		{name: "missing exec", args: []string{"cancel", "demo"}, code: 2, stderr: "~missing EXEC"},
		{name: "running", args: []string{"cancel", "demo", id}, stdout: id + ": cancelled; what it changed so far remains\n"},
		{name: "again", args: []string{"cancel", "demo", id}, code: 1, stderr: "~it already ended (cancelled)"},
	})
	if x, err := w.fake.Execution(t.Context(), id); err != nil || x.State != session.ExecCancelled || w.fake.Calls("Cancel") != 2 {
		t.Errorf("after cancel: %s, %v, %d Cancel calls; want cancelled through Cancel", x.State, err, w.fake.Calls("Cancel"))
	}
}

// exec --cwd with a directory that is not there blames the directory, not
// the command.
func TestExecMissingCwd(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	if err := w.fake.AddFile("demo", "afile", []byte("x"), epoch); err != nil {
		t.Fatal(err)
	}
	runAll(t, w, []tc{
		{name: "missing", args: []string{"exec", "demo", "--cwd", "/workspace/nonexistent", "--", "pwd"}, code: 127,
			stderr: "berth: e0001 could not start: working directory /workspace/nonexistent does not exist\n"},
		{name: "a file", args: []string{"exec", "demo", "--cwd", "afile", "--", "pwd"}, code: 127,
			stderr: "berth: e0002 could not start: working directory /workspace/afile is not a directory\n"},
	})
}

// The workspace's use is the last measured figure, with when it was
// measured; never measured, it says so rather than 0 B.
func TestWorkspaceUse(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.fake.AddSession(session.Session{Name: "asleep", State: session.StateSleeping, Image: "mini", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30,
		RootDirectory: "/workspace", WorkspaceUsed: 12 << 20, WorkspaceMeasuredAt: now.Add(-3 * time.Minute)})
	w.fake.AddSession(session.Session{Name: "fresh", State: session.StateStopped, Image: "mini", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30,
		RootDirectory: "/workspace"})
	runAll(t, w, []tc{
		{name: "info measured", args: []string{"info", "asleep"}, stdout: "~Workspace:    12 MiB used of 4.0 GiB, at /workspace (measured 3m ago)\n"},
		{name: "info not measured", args: []string{"info", "fresh"}, stdout: "~Workspace:    4.0 GiB, at /workspace; its use is not measured yet\n"},
		{name: "ls", args: []string{"ls"}, stdout: "~asleep  sleeping  mini   1     512 MiB  4.0 GiB  12 MiB  -       0 B    0        1h ago\nfresh   stopped   mini   1     512 MiB  4.0 GiB  ?       -"},
	})
}

func TestExecUser(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	runAll(t, w, []tc{
		{name: "as root", args: []string{"exec", "demo", "--user", "root", "--", "pwd"}, stdout: "/workspace\n"},
		{name: "as a user the guest lacks", args: []string{"exec", "demo", "--user", "ghost", "--", "pwd"}, code: 127,
			stderr: "berth: e0002 could not start: exec: cannot run as user \"ghost\": the VM's /etc/passwd does not have it\n"},
		{name: "malformed", args: []string{"exec", "demo", "--user", "app:", "--", "pwd"}, code: 2,
			stderr: "~--user \"app:\": want NAME or UID, with an optional :GROUP or :GID"},
		{name: "shell, malformed", args: []string{"shell", "demo", "--user", "a b"}, code: 2, stderr: "~--user \"a b\" has a space"},
	})
	if x := waitDone(t, w, "e0001"); x.User != "root" {
		t.Errorf("the record of a command run as root says user %q", x.User)
	}
}

// fleetService lists a fleet's sessions: each with its host, one on a
// host that is gone.
type fleetService struct {
	session.Service
	list []session.Session
}

func (f fleetService) List(context.Context) ([]session.Session, error) { return f.list, nil }

// In a fleet ls has a HOST column, and an unreachable session shows its
// spec with dashes for what is not known; alone, no HOST column.
func TestLsInAFleet(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	created := now.Add(-time.Hour)
	svc := fleetService{Service: w.client, list: []session.Session{
		{Name: "demo", Host: "h1", State: session.StateRunning, Image: "mini", CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30, CreatedAt: created},
		{Name: "far", Host: "h2", State: session.StateUnreachable, Image: "mini", CPUs: 2, MemoryMiB: 1024, DiskBytes: 8 << 30},
	}}
	env := cli.Env{Connect: func(context.Context) (session.Service, error) { return svc, nil }}
	r := w.run(t.Context(), env, "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME  HOST  STATE") ||
		!strings.HasPrefix(lines[1], "demo  h1    running") || !strings.HasPrefix(lines[2], "far   h2    unreachable") || !strings.HasSuffix(lines[2], "-") {
		t.Errorf("ls in a fleet:\n%s", r.stdout)
	}
	r = w.run(t.Context(), env, "ls", "--json")
	if !strings.Contains(r.stdout, `"host": "h2"`) {
		t.Errorf("ls --json lacks the host:\n%s", r.stdout)
	}
	if out := w.sh(t, "ls"); strings.Contains(out, "HOST") {
		t.Errorf("ls alone has a HOST column:\n%s", out)
	}
}

// Handles tells the built-in commands, which berth runs itself, from the
// command lines it hands to berth-host: the host's own commands, help and
// completion (they read the whole table), and anything it cannot parse.
func TestHandles(t *testing.T) {
	for args, want := range map[string]bool{
		"exec demo -- true":               true,
		"--data /tmp/d exec demo -- true": true,
		"ls":                              true,
		"run start demo":                  true,
		"":                                false, // the TUI
		"serve":                           false,
		"--data /tmp/d serve":             false,
		"image build mini":                false,
		"port-forward demo 8080":          false,
		"version":                         false,
		"help":                            false,
		"--help":                          false,
		"completion bash":                 false,
		"__complete exec":                 false,
		"mcp --session demo":              false, // Env.MCP: berth does not link the server
		"nosuch":                          false,
		"--data":                          false,
	} {
		if got := cli.Handles(strings.Fields(args)); got != want {
			t.Errorf("Handles(%q) = %v, want %v", args, got, want)
		}
	}
}
