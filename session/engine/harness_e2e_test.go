package engine_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

func (e *env) runs(name string) []session.Run {
	e.T.Helper()
	var l []session.Run
	if err := json.Unmarshal([]byte(e.OK("runs", name, "--json")), &l); err != nil {
		e.T.Fatal(err)
	}
	return l
}

func (e *env) schedules(name string) []session.Schedule {
	e.T.Helper()
	var l []session.Schedule
	if err := json.Unmarshal([]byte(e.OK("schedule", "ls", name, "--json")), &l); err != nil {
		e.T.Fatal(err)
	}
	return l
}

// schedExecs lists the executions a schedule started, oldest first.
func (e *env) schedExecs(name, id string) []session.Execution {
	var out []session.Execution
	for _, x := range e.Execs(name) {
		if x.By == "schedule:"+id {
			out = append(out, x)
		}
	}
	return out
}

// eventually polls cond until it holds, failing after within.
func (e *env) eventually(what string, within time.Duration, cond func() bool) {
	e.T.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			e.T.Fatalf("%s: not within %s\ndaemon log:\n%s", what, within, e.DaemonLog())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// freeAddr is a loopback address nobody listens on now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (bool, string, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v", tool, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	var out map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
	}
	return res.IsError, text, out
}

// The Harness contract, kept by the real Manager in-process and through
// the socket.
func TestManagerHarness(t *testing.T) {
	m := newManager(t)
	t.Run("in-process", func(t *testing.T) { sessiontest.HarnessSuite(t, m) })
	t.Run("socket", func(t *testing.T) {
		c := serveSocket(t, m)
		sessiontest.HarnessSuite(t, c)
	})
}

// TestHarnessEndToEnd drives agent runs, the MCP server (the SDK's client,
// over stdio and over SSH) and schedules against a real daemon and VM.
func TestHarnessEndToEnd(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"128M\"\nidle_timeout = \"0\"\nrun_timeout = \"3s\"\n"), 0o644)
	addr := freeAddr(t)
	e.StartDaemon("--ssh", addr)
	e.OK("create", "h")

	e.Subtest(t, "runs", func(t *testing.T) {
		id := strings.TrimSpace(e.OK("run", "start", "h", "--title", "build"))
		e.OK("exec", "--run", id, "h", "--", "sh", "-c", "echo one")
		e.RunIn("12345678", "put", "--run", id, "h", "-", "run.txt")
		var r session.Run
		for _, x := range e.runs("h") {
			if x.ID == id {
				r = x
			}
		}
		if r.Title != "build" || r.By != "cli" || r.Executions != 1 || r.BytesWritten != 8 || r.Status != session.RunOpen {
			t.Errorf("run = %+v, want build by cli, 1 execution, 8 bytes, open", r)
		}
		e.OK("run", "end", id, "--status", "ok")
		e.Fails("already ended", "run", "end", id)
		e.Fails("has ended", "exec", "--run", id, "h", "--", "true")

		// A run left open with a command in it: the command goes on, the
		// run is abandoned once it is over and the run timeout passed.
		left := strings.TrimSpace(e.OK("run", "start", "h"))
		xid := strings.TrimSpace(e.OK("exec", "--run", left, "--detach", "h", "--", "sh", "-c", "sleep 2; echo late > late.txt"))
		time.Sleep(2500 * time.Millisecond) // past the run timeout, the command still in it
		e.eventually("the left run abandoned", 20*time.Second, func() bool {
			for _, x := range e.runs("h") {
				if x.ID == left {
					if x.Status != session.RunOpen && x.Status != session.RunAbandoned {
						t.Fatalf("left run ended %s, want abandoned", x.Status)
					}
					return x.Status == session.RunAbandoned
				}
			}
			return false
		})
		for _, x := range e.Execs("h") {
			if x.ID == xid && (x.State != session.ExecExited || *x.ExitCode != 0) {
				t.Errorf("the run's command ended %s, want it to run to its end", x.State)
			}
		}
		if got := e.OK("cat", "h", "late.txt"); got != "late\n" {
			t.Errorf("late.txt = %q", got)
		}
	})

	e.Subtest(t, "mcp over stdio", func(t *testing.T) {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
		cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: e.Cmd("mcp", "--session", "h")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		tools, err := cs.ListTools(t.Context(), nil)
		if err != nil || len(tools.Tools) != 13 {
			t.Fatalf("ListTools = %d tools, %v", len(tools.Tools), err)
		}
		for _, tool := range tools.Tools {
			if b, _ := json.Marshal(tool.InputSchema); !strings.Contains(string(b), `"type":"object"`) {
				t.Errorf("%s's schema %s", tool.Name, b)
			}
		}
		isErr, msg, out := callTool(t, cs, "exec", map[string]any{"command": "echo out; echo err >&2; exit 3"})
		if isErr || out["exit_code"] != 3.0 || out["stdout"] != "out\n" || out["stderr"] != "err\n" {
			t.Errorf("exec exit 3 = %v %q %v", isErr, msg, out)
		}
		content := strings.Repeat("héllo wörld ✓ \t\r\n", 5000) + "end"
		if isErr, msg, _ := callTool(t, cs, "write_file", map[string]any{"path": "dir/../mcp.txt", "content": content}); isErr {
			t.Fatalf("write_file: %s", msg)
		}
		if _, _, out := callTool(t, cs, "read_file", map[string]any{"path": "/workspace/mcp.txt"}); out["content"] != content {
			t.Errorf("read_file is not byte-exact: %d bytes back of %d", len(fmt.Sprint(out["content"])), len(content))
		}
		// The connection's run kept its start (run_checkpoint, on by
		// default): the agent can review what it changed.
		if isErr, msg, out := callTool(t, cs, "run_diff", map[string]any{}); isErr || !strings.Contains(fmt.Sprint(out["changes"]), "mcp.txt") {
			t.Errorf("run_diff = %v %q %v", isErr, msg, out)
		}
		callTool(t, cs, "write_file", map[string]any{"path": "e.txt", "content": "a\nb\na\n"})
		if isErr, msg, _ := callTool(t, cs, "edit_file", map[string]any{"path": "e.txt", "old_string": "a", "new_string": "x"}); !isErr || !strings.Contains(msg, "occurs 2 times") {
			t.Errorf("edit_file ambiguous = %v %q", isErr, msg)
		}
		if isErr, msg, _ := callTool(t, cs, "edit_file", map[string]any{"path": "e.txt", "old_string": "zzz", "new_string": "x"}); !isErr || !strings.Contains(msg, "does not contain") {
			t.Errorf("edit_file absent = %v %q", isErr, msg)
		}
		if isErr, msg, _ := callTool(t, cs, "edit_file", map[string]any{"path": "e.txt", "old_string": "b\na", "new_string": "B"}); isErr {
			t.Errorf("edit_file exact: %s", msg)
		}
		if got := e.OK("cat", "h", "e.txt"); got != "a\nB\n" {
			t.Errorf("after the edits e.txt = %q, want a, B", got)
		}
		if isErr, msg, _ := callTool(t, cs, "exec", map[string]any{"session": "zz", "command": "true"}); !isErr || !strings.Contains(msg, `works on session "h" only`) {
			t.Errorf("exec outside --session = %v %q", isErr, msg)
		}
		if isErr, msg, _ := callTool(t, cs, "read_file", map[string]any{"path": "../../etc/passwd"}); !isErr || !strings.Contains(msg, "/workspace") {
			t.Errorf("read_file escaping = %v %q", isErr, msg)
		}

		// The client goes away mid-exec: the command goes on, recorded.
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "sleep 3; echo done > gone.txt"}})
		cancel()
		cs.Close()
		var run session.Run
		for _, r := range e.runs("h") {
			if r.Title == "MCP: e2e-agent" {
				run = r
			}
		}
		if run.Executions != 2 || run.BytesWritten == 0 {
			t.Errorf("the connection's run = %+v, want 2 executions and its writes", run)
		}
		e.eventually("the disconnected client's run abandoned", 20*time.Second, func() bool {
			for _, r := range e.runs("h") {
				if r.ID == run.ID {
					return r.Status == session.RunAbandoned
				}
			}
			return false
		})
		if got := e.OK("cat", "h", "gone.txt"); got != "done\n" {
			t.Errorf("the command of a client that went away: gone.txt = %q", got)
		}
	})

	e.Subtest(t, "mcp over ssh", func(t *testing.T) {
		dial := func(role string) *gossh.Client {
			_, priv, _ := ed25519.GenerateKey(rand.Reader)
			signer, _ := gossh.NewSignerFromKey(priv)
			pub := filepath.Join(t.TempDir(), role+".pub")
			os.WriteFile(pub, []byte(strings.TrimSpace(string(gossh.MarshalAuthorizedKey(signer.PublicKey())))+" "+role+"@e2e\n"), 0o644)
			e.OK("ssh", "add-key", "--role", role, pub)
			c, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "berth", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		connect := func(c *gossh.Client) *mcp.ClientSession {
			sess, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			stdin, _ := sess.StdinPipe()
			stdout, _ := sess.StdoutPipe()
			if err := sess.Start("mcp --session h"); err != nil {
				t.Fatal(err)
			}
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "ssh-agent", Version: "1"}, nil).Connect(t.Context(), &mcp.IOTransport{Reader: io.NopCloser(stdout), Writer: stdin}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cs.Close(); sess.Close() })
			return cs
		}
		viewer := connect(dial("viewer"))
		tools, err := viewer.ListTools(t.Context(), nil)
		if err != nil || len(tools.Tools) != 6 {
			t.Errorf("a viewer's tools over SSH: %d, %v; want the 6 read tools", len(tools.Tools), err)
		}
		if isErr, msg, _ := callTool(t, viewer, "exec", map[string]any{"command": "touch viewer.txt"}); !isErr || !strings.Contains(msg, "role viewer") {
			t.Errorf("exec as a viewer over SSH = %v %q", isErr, msg)
		}
		if _, _, out := callTool(t, viewer, "read_file", map[string]any{"path": "e.txt"}); out["content"] != "a\nB\n" {
			t.Errorf("read_file as a viewer = %v", out)
		}
		op := connect(dial("operator"))
		if isErr, msg, out := callTool(t, op, "exec", map[string]any{"command": "echo $((6*7))"}); isErr || out["stdout"] != "42\n" {
			t.Errorf("exec as an operator over SSH = %v %q %v", isErr, msg, out)
		}
		found := slices.ContainsFunc(e.Execs("h"), func(x session.Execution) bool { return x.By == "ssh:operator@e2e" })
		if !found {
			t.Errorf("no execution recorded as ssh:operator@e2e")
		}
	})

	e.Subtest(t, "schedule fires on a running session", func(t *testing.T) {
		e.Fails("day-of-week field", "schedule", "add", "h", "* * * * 8", "--", "true")
		e.Fails("below the minimum", "schedule", "add", "h", "@every 0s", "--", "true")
		id := strings.TrimSpace(e.OK("schedule", "add", "h", "@every 2s", "--", "sh", "-c", "echo tick"))
		e.eventually("two firings", 15*time.Second, func() bool { return len(e.schedExecs("h", id)) >= 2 })
		e.OK("schedule", "rm", "h", id)
		runs := 0
		for _, r := range e.runs("h") {
			if r.Schedule == id {
				runs++
				if r.Executions != 1 || !strings.Contains(r.Title, id) || r.Status == session.RunAbandoned {
					t.Errorf("schedule run = %+v", r)
				}
			}
		}
		if runs < 2 {
			t.Errorf("%d runs of the schedule, want one per firing", runs)
		}
	})

	e.Subtest(t, "schedule skips while the previous one runs", func(t *testing.T) {
		id := strings.TrimSpace(e.OK("schedule", "add", "h", "@every 2s", "--overlap", "skip", "--", "sleep", "5"))
		time.Sleep(9 * time.Second)
		e.OK("schedule", "rm", "h", id)
		xs := e.schedExecs("h", id)
		if len(xs) < 1 || len(xs) > 2 {
			t.Errorf("%d firings of a 5s command every 2s in 9s under skip, want 1 or 2", len(xs))
		}
		for i := 1; i < len(xs); i++ {
			if !xs[i-1].EndedAt.IsZero() && xs[i].StartedAt.Before(xs[i-1].EndedAt) {
				t.Errorf("firings overlap under skip: %s started before %s ended", xs[i].ID, xs[i-1].ID)
			}
		}
		out := e.OK("events", "h")
		if !strings.Contains(out, "schedule "+id+" skipped") {
			t.Errorf("timeline does not show the skip:\n%s", out)
		}
		e.eventually("the last firing ends", 10*time.Second, func() bool {
			for _, x := range e.schedExecs("h", id) {
				if !x.State.Done() {
					return false
				}
			}
			return true
		})
	})

	e.Subtest(t, "schedule wakes a sleeping session", func(t *testing.T) {
		e.OK("sleep", "h")
		e.WaitState("h", session.StateSleeping, 30*time.Second)
		id := strings.TrimSpace(e.OK("schedule", "add", "h", "@every 2s", "--", "touch", "woke.txt"))
		e.eventually("a firing in the woken session", 40*time.Second, func() bool {
			xs := e.schedExecs("h", id)
			return len(xs) > 0 && xs[0].State == session.ExecExited
		})
		e.OK("schedule", "rm", "h", id)
		if s := e.Info("h"); s.State != session.StateRunning {
			t.Errorf("after the firing the session is %s, want running", s.State)
		}
		e.OK("cat", "h", "woke.txt")
	})

	e.Subtest(t, "schedule survives a daemon kill -9 without firing twice", func(t *testing.T) {
		id := strings.TrimSpace(e.OK("schedule", "add", "h", "@every 2s", "--overlap", "skip", "--", "sh", "-c", "echo start >> k.txt; sleep 1; echo end >> k.txt"))
		e.eventually("a firing running", 15*time.Second, func() bool {
			xs := e.schedExecs("h", id)
			return len(xs) > 0 && xs[len(xs)-1].State == session.ExecRunning
		})
		e.Daemon.Process.Signal(syscall.SIGKILL)
		e.Daemon.Wait()
		e.Daemon = nil
		time.Sleep(4500 * time.Millisecond) // two ticks fall due while it is down
		restarted := time.Now()
		e.StartDaemon("--ssh", addr)
		e.eventually("the missed firing", 15*time.Second, func() bool {
			return slices.ContainsFunc(e.schedExecs("h", id), func(x session.Execution) bool { return x.StartedAt.After(restarted) })
		})
		e.OK("schedule", "rm", "h", id)
		e.eventually("every firing over", 15*time.Second, func() bool {
			for _, x := range e.schedExecs("h", id) {
				if !x.State.Done() {
					return false
				}
			}
			return true
		})
		xs := e.schedExecs("h", id)
		caughtUp := 0
		for i, x := range xs {
			if x.State != session.ExecExited || x.ExitCode == nil || *x.ExitCode != 0 {
				t.Errorf("firing %s ended %s (%s), want exited 0 (caught up after the kill)", x.ID, x.State, x.Error)
			}
			if i > 0 && x.StartedAt.Before(xs[i-1].EndedAt) {
				t.Errorf("firings %s and %s overlap under skip: one fired twice", xs[i-1].ID, x.ID)
			}
			if x.StartedAt.After(restarted) {
				caughtUp++
			}
		}
		// The missed ticks run once; a regular tick may just have followed
		// before the remove.
		if caughtUp < 1 || caughtUp > 2 {
			t.Errorf("%d firings after the restart, want the missed ticks run once", caughtUp)
		}
		if n := strings.Count(e.OK("events", "h"), "schedule "+id+" was due at"); n != 1 {
			t.Errorf("the timeline says %d times that a missed firing runs, want once", n)
		}
		k := e.OK("cat", "h", "k.txt")
		if starts, ends := strings.Count(k, "start"), strings.Count(k, "end"); starts != len(xs) || ends != len(xs) {
			t.Errorf("k.txt has %d starts and %d ends for %d recorded firings", starts, ends, len(xs))
		}
		if out := e.OK("events", "h"); !strings.Contains(out, "while the daemon was down: running it once now") {
			t.Errorf("the timeline does not say the missed firing was caught up:\n%s", out)
		}
	})

	e.Subtest(t, "a stopped session holds its schedules", func(t *testing.T) {
		id := strings.TrimSpace(e.OK("schedule", "add", "h", "@every 1s", "--", "true"))
		e.OK("stop", "h")
		before := len(e.schedExecs("h", id))
		time.Sleep(3 * time.Second)
		if after := len(e.schedExecs("h", id)); after != before {
			t.Errorf("a stopped session ran %d firings", after-before)
		}
		scs := e.schedules("h")
		if len(scs) != 1 || !strings.Contains(scs[0].Held, "stopped") {
			t.Errorf("schedule ls of a stopped session = %+v, want it held", scs)
		}
		if out := e.OK("schedule", "ls", "h"); !strings.Contains(out, "held: session is stopped") {
			t.Errorf("schedule ls:\n%s", out)
		}
		e.OK("delete", "h", "--yes")
		if out := e.Run("schedule", "ls", "h"); out.Code == 0 {
			t.Errorf("schedule ls after delete succeeded: %q", out.Stdout)
		}
	})
}
