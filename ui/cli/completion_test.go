package cli_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

// Candidates come from the command table and, for NAME arguments, from
// the daemon's sessions.
func TestComplete(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	for _, name := range []string{"alpha", "beta"} {
		w.sh(t, "create", name)
	}
	complete := func(words ...string) []string {
		r := w.run(t.Context(), cli.Env{}, append([]string{"__complete", "--"}, words...)...)
		if r.code != 0 {
			t.Fatalf("__complete %q: exit %d %s", words, r.code, r.stderr)
		}
		return strings.Fields(r.stdout)
	}
	for _, tc := range []struct {
		words      []string
		want, not  []string
		exactlyAll bool
	}{
		{words: []string{""}, want: []string{"create", "exec", "ls", "checkpoint", "completion", "help"}, not: []string{"__complete"}},
		{words: []string{"ex"}, want: []string{"exec"}, exactlyAll: true},
		{words: []string{"exec", ""}, want: []string{"alpha", "beta"}, exactlyAll: true},
		{words: []string{"exec", "a"}, want: []string{"alpha"}, exactlyAll: true},
		{words: []string{"exec", "-"}, want: []string{"--cwd", "--detach"}},
		{words: []string{"exec", "alpha", ""}, want: nil, exactlyAll: true}, // the command: the shell's own
		{words: []string{"create", "--cpus", ""}, want: nil, exactlyAll: true},
		{words: []string{"create", "-"}, want: []string{"--cpus", "--memory", "--image"}},
		{words: []string{"checkpoint", "rm", ""}, want: []string{"alpha", "beta"}, exactlyAll: true},
		{words: []string{"checkpoint", "r"}, want: []string{"rm"}},
		{words: []string{"--data", "/x", "in"}, want: []string{"info"}, exactlyAll: true},
		{words: []string{"--data", ""}, want: nil, exactlyAll: true},
		{words: []string{"-"}, want: []string{"--data", "--cache"}},
		{words: []string{"completion", ""}, want: nil, exactlyAll: true},
		{words: []string{"help", "fo"}, want: []string{"fork"}, exactlyAll: true},
	} {
		got := complete(tc.words...)
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("%q: %q lacks %q", tc.words, got, w)
			}
		}
		for _, n := range tc.not {
			if slices.Contains(got, n) {
				t.Errorf("%q: %q has %q", tc.words, got, n)
			}
		}
		if tc.exactlyAll && len(got) != len(tc.want) {
			t.Errorf("%q: %q, want exactly %q", tc.words, got, tc.want)
		}
	}
}

// No daemon: names complete to nothing, quietly, and the Tab starts none
// (ConnectRunning is asked, never Connect).
func TestCompleteWithoutDaemon(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	env := cli.Env{
		Connect: func(context.Context) (session.Service, error) {
			t.Error("completion called Connect, which starts a daemon")
			return nil, errors.New("no")
		},
		ConnectRunning: func(context.Context) (session.Service, error) { return nil, session.ErrUnavailable },
	}
	r := w.run(t.Context(), env, "__complete", "--", "exec", "")
	if r.code != 0 || r.stdout != "" || r.stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// The bash script hands the words before the cursor and the current one
// to `berth __complete` and fills COMPREPLY with its lines.
func TestBashCompletionScript(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	w := newWorld(t, sessiontest.Options{})
	script := w.sh(t, "completion", "bash")
	dir := t.TempDir()
	// A berth on PATH that records its arguments and answers two lines.
	fake := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + filepath.Join(dir, "args") + "\nprintf 'alpha\\nalpha-two\\n'\n"
	if err := os.WriteFile(filepath.Join(dir, "berth"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	prog := script + `
COMP_WORDS=(berth --data /d exec al)
COMP_CWORD=4
_berth
printf '%s\n' "${COMPREPLY[@]}"
`
	cmd := exec.Command(bash, "--norc", "-c", prog)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); !slices.Equal(got, []string{"alpha", "alpha-two"}) {
		t.Errorf("COMPREPLY = %q", got)
	}
	args, _ := os.ReadFile(filepath.Join(dir, "args"))
	if got := strings.Split(strings.TrimSpace(string(args)), "\n"); !slices.Equal(got, []string{"__complete", "--", "--data", "/d", "exec", "al"}) {
		t.Errorf("berth got %q", got)
	}
}

func TestCompletionScripts(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if out := w.sh(t, "completion", shell); !strings.Contains(out, "berth __complete") {
			t.Errorf("%s script does not ask berth __complete:\n%s", shell, out)
		}
	}
	r := w.run(t.Context(), cli.Env{}, "completion", "tcsh")
	if r.code != cli.ExitUsage || !strings.Contains(r.stderr, `no completion for shell "tcsh": use bash, zsh or fish`) {
		t.Errorf("tcsh: exit %d, %q", r.code, r.stderr)
	}
}
