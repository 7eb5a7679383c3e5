package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/mcpserver"
	"github.com/berthvm/berth/ui/sshd"
)

// connect serves svc's tools to an SDK client over in-memory transports.
func connect(t *testing.T, svc session.Service, opts mcpserver.Options) *mcp.ClientSession {
	t.Helper()
	ctx := t.Context()
	st, ct := mcp.NewInMemoryTransports()
	srv := mcpserver.New(ctx, svc, opts)
	done := make(chan error, 1)
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	go func() { done <- srv.Serve(sctx, st) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		stop()
		<-done
	})
	return cs
}

// call calls a tool; it fails the test on a protocol error.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) (*mcp.CallToolResult, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v, want a result", tool, err)
	}
	var out map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
	}
	return res, out
}

func text(res *mcp.CallToolResult) string {
	var sb strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			sb.WriteString(tc.Text)
		}
	}
	return sb.String()
}

func wantToolError(t *testing.T, what string, res *mcp.CallToolResult, says string) {
	t.Helper()
	if !res.IsError || !strings.Contains(text(res), says) {
		t.Errorf("%s: error %v %q, want a tool error saying %q", what, res.IsError, text(res), says)
	}
	if strings.Contains(text(res), "\n") {
		t.Errorf("%s: error %q is not one line", what, text(res))
	}
}

func newFake(t *testing.T) *sessiontest.Fake {
	f := sessiontest.New(sessiontest.Options{})
	t.Cleanup(func() { f.Close() })
	for _, name := range []string{"demo", "other"} {
		if _, err := f.Create(t.Context(), session.CreateOptions{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	f.Handle("fail", func(ctx context.Context, p *sessiontest.Proc) (int, error) {
		fmt.Fprint(p.Stdout, "out")
		fmt.Fprint(p.Stderr, "broken")
		return 3, nil
	})
	f.Handle("flood", func(ctx context.Context, p *sessiontest.Proc) (int, error) {
		for i := range 2000 {
			fmt.Fprintf(p.Stdout, "line %04d ..............................................\n", i)
		}
		return 0, nil
	})
	return f
}

func TestTools(t *testing.T) {
	f := newFake(t)
	cs := connect(t, f, mcpserver.Options{})
	ctx := t.Context()

	t.Run("List", func(t *testing.T) {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
			if tool.Description == "" || tool.InputSchema == nil {
				t.Errorf("tool %s has no description or schema", tool.Name)
			}
			if tool.Name == "exec" {
				b, _ := json.Marshal(tool.InputSchema)
				for _, prop := range []string{`"command"`, `"argv"`, `"cwd"`, `"env"`, `"timeout_seconds"`, `"session"`} {
					if !strings.Contains(string(b), prop) {
						t.Errorf("exec's schema %s lacks %s", b, prop)
					}
				}
			}
		}
		want := []string{"list_sessions", "create_session", "session_info", "exec", "cancel", "read_output", "read_file", "write_file", "edit_file", "list_files", "forward_port", "flush", "run_diff"}
		slices.Sort(names)
		slices.Sort(want)
		if !slices.Equal(names, want) {
			t.Errorf("tools = %v, want %v", names, want)
		}
	})

	t.Run("Exec", func(t *testing.T) {
		res, out := call(t, cs, "exec", map[string]any{"session": "demo", "argv": []string{"fail"}})
		if res.IsError || out["exit_code"] != 3.0 || out["stdout"] != "out" || out["stderr"] != "broken" || out["state"] != "exited" {
			t.Errorf("exec fail = %v %v, want exit 3 with its output", res.IsError, out)
		}
		_, out = call(t, cs, "exec", map[string]any{"session": "demo", "command": "echo hello"})
		if out["exit_code"] != 0.0 || out["stdout"] != "hello\n" {
			t.Errorf("exec echo = %v", out)
		}
		res, _ = call(t, cs, "exec", map[string]any{"session": "demo"})
		wantToolError(t, "exec without a command", res, "no command")
		res, _ = call(t, cs, "exec", map[string]any{"session": "nosuch", "command": "true"})
		wantToolError(t, "exec in a missing session", res, "not found")
		res, _ = call(t, cs, "exec", map[string]any{"session": "demo", "command": 42})
		wantToolError(t, "exec with a number for command", res, "command")
		_, out = call(t, cs, "exec", map[string]any{"session": "demo", "command": "echo hello", "user": "root"})
		if out["exit_code"] != 0.0 || out["stdout"] != "hello\n" {
			t.Errorf("exec as root = %v", out)
		}
		res, _ = call(t, cs, "exec", map[string]any{"session": "demo", "command": "true", "user": "a b"})
		wantToolError(t, "exec as a malformed user", res, "argument user:")
	})

	t.Run("ExecBoundsOutput", func(t *testing.T) {
		_, out := call(t, cs, "exec", map[string]any{"session": "demo", "argv": []string{"flood"}})
		stdout, _ := out["stdout"].(string)
		id, _ := out["exec_id"].(string)
		if len(stdout) > mcpserver.DefaultOutputLimit+300 || out["truncated"] != true || !strings.Contains(stdout, "omitted here; read_output with exec_id \""+id+"\"") {
			t.Fatalf("exec flood: %d bytes, truncated %v, want it bounded with a marker naming %s", len(stdout), out["truncated"], id)
		}
		if !strings.HasPrefix(stdout, "line 0000") || !strings.HasSuffix(stdout, "line 1999 ..............................................\n") {
			t.Errorf("exec flood keeps %q ... %q, want the head and the tail", stdout[:20], stdout[len(stdout)-40:])
		}
		// read_output pages through all of it.
		var all strings.Builder
		from := 1.0
		for range 100 {
			res, page := call(t, cs, "read_output", map[string]any{"exec_id": id, "from_seq": from, "max_bytes": 20000})
			if res.IsError {
				t.Fatalf("read_output: %s", text(res))
			}
			all.WriteString(page["stdout"].(string))
			from = page["next_seq"].(float64)
			if page["done"] == true {
				break
			}
		}
		if got := strings.Count(all.String(), "\n"); got != 2000 {
			t.Errorf("read_output pages hold %d lines, want 2000", got)
		}
		res, _ := call(t, cs, "read_output", map[string]any{"exec_id": "enope"})
		wantToolError(t, "read_output of an unknown execution", res, "not found")
	})

	t.Run("Files", func(t *testing.T) {
		content := "alpha\nbeta\ngamma\nbeta\n\x7f unicode ✓\n"
		res, out := call(t, cs, "write_file", map[string]any{"session": "demo", "path": "notes.txt", "content": content})
		if res.IsError || out["written"] != float64(len(content)) {
			t.Fatalf("write_file = %s %v", text(res), out)
		}
		_, out = call(t, cs, "read_file", map[string]any{"session": "demo", "path": "/workspace/notes.txt"})
		if out["content"] != content || out["lines"] != 5.0 {
			t.Errorf("read_file = %q, want %q byte-exact", out["content"], content)
		}
		_, out = call(t, cs, "read_file", map[string]any{"session": "demo", "path": "notes.txt", "offset": 2, "limit": 2})
		if out["content"] != "beta\ngamma\n" {
			t.Errorf("read_file lines 2-3 = %q", out["content"])
		}

		res, _ = call(t, cs, "edit_file", map[string]any{"session": "demo", "path": "notes.txt", "old_string": "beta", "new_string": "BETA"})
		wantToolError(t, "edit_file ambiguous", res, "occurs 2 times in notes.txt (lines 2, 4)")
		res, _ = call(t, cs, "edit_file", map[string]any{"session": "demo", "path": "notes.txt", "old_string": "delta", "new_string": "x"})
		wantToolError(t, "edit_file absent", res, "does not contain old_string")
		_, out = call(t, cs, "read_file", map[string]any{"session": "demo", "path": "notes.txt"})
		if out["content"] != content {
			t.Errorf("failed edits changed the file: %q", out["content"])
		}
		res, out = call(t, cs, "edit_file", map[string]any{"session": "demo", "path": "notes.txt", "old_string": "gamma\nbeta", "new_string": "GAMMA"})
		if res.IsError || out["line"] != 3.0 {
			t.Errorf("edit_file exact = %s %v", text(res), out)
		}
		_, out = call(t, cs, "read_file", map[string]any{"session": "demo", "path": "notes.txt"})
		if want := "alpha\nbeta\nGAMMA\n\x7f unicode ✓\n"; out["content"] != want {
			t.Errorf("after edit_file: %q, want %q", out["content"], want)
		}

		_, out = call(t, cs, "list_files", map[string]any{"session": "demo"})
		if b, _ := json.Marshal(out); !strings.Contains(string(b), `"name":"notes.txt"`) {
			t.Errorf("list_files = %s", b)
		}
		extra := map[string]map[string]any{"write_file": {"content": "x"}, "edit_file": {"old_string": "a", "new_string": "b"}}
		for _, tool := range []string{"read_file", "write_file", "list_files", "edit_file"} {
			for _, p := range []string{"../etc/passwd", "/etc/passwd", "/workspace/../etc"} {
				args := map[string]any{"session": "demo", "path": p}
				for k, v := range extra[tool] {
					args[k] = v
				}
				res, _ := call(t, cs, tool, args)
				wantToolError(t, tool+" "+p, res, "/workspace")
			}
		}
	})

	t.Run("Sessions", func(t *testing.T) {
		_, out := call(t, cs, "list_sessions", map[string]any{})
		if b, _ := json.Marshal(out); !strings.Contains(string(b), `"name":"demo"`) || !strings.Contains(string(b), `"name":"other"`) {
			t.Errorf("list_sessions = %s", b)
		}
		_, out = call(t, cs, "session_info", map[string]any{"session": "demo"})
		if out["name"] != "demo" || out["state"] != "running" {
			t.Errorf("session_info = %v", out)
		}
		res, out := call(t, cs, "create_session", map[string]any{"name": "fresh", "memory": "1G"})
		if res.IsError || out["name"] != "fresh" || out["memory_mib"] != 1024.0 {
			t.Errorf("create_session = %s %v", text(res), out)
		}
		res, _ = call(t, cs, "create_session", map[string]any{"name": "Bad_Name"})
		wantToolError(t, "create_session bad name", res, "invalid session name")
		res, _ = call(t, cs, "create_session", map[string]any{"name": "copy", "from": "fresh"})
		wantToolError(t, "create_session from a session without checkpoints", res, `argument from: fresh: session "fresh" has no checkpoints`)
		if _, err := f.Checkpoint(ctx, "fresh", session.CheckpointOptions{}); err != nil {
			t.Fatal(err)
		}
		res, out = call(t, cs, "create_session", map[string]any{"name": "copy", "from": "fresh@c1"})
		if res.IsError || out["name"] != "copy" || out["memory_mib"] != 1024.0 {
			t.Errorf("create_session from a checkpoint = %s %v", text(res), out)
		}
		res, out = call(t, cs, "flush", map[string]any{"session": "demo"})
		if res.IsError {
			t.Errorf("flush: %s", text(res))
		}
	})

	t.Run("UnknownTool", func(t *testing.T) {
		res, _ := call(t, cs, "format_disk", map[string]any{})
		wantToolError(t, "unknown tool", res, `unknown tool "format_disk"`)
	})

	t.Run("OneRunPerConnection", func(t *testing.T) {
		runs, err := f.Runs(ctx, "demo")
		if err != nil || len(runs) != 1 {
			t.Fatalf("runs of demo = %+v, %v; want the connection's one", runs, err)
		}
		r := runs[0]
		if r.Title != "MCP: test-agent" || r.Status != session.RunOpen || r.Executions != 4 || r.BytesWritten == 0 {
			t.Errorf("the connection's run = %+v, want it titled for the client, open, with its executions and writes", r)
		}
	})
}

func TestConfined(t *testing.T) {
	f := newFake(t)
	cs := connect(t, f, mcpserver.Options{Session: "demo"})
	_, out := call(t, cs, "exec", map[string]any{"command": "echo hi"})
	if out["stdout"] != "hi\n" {
		t.Errorf("exec in the default session = %v", out)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"session": "other", "command": "true"}},
		{"read_file", map[string]any{"session": "other", "path": "x"}},
		{"write_file", map[string]any{"session": "other", "path": "x", "content": "y"}},
		{"session_info", map[string]any{"session": "other"}},
		{"flush", map[string]any{"session": "other"}},
	} {
		res, _ := call(t, cs, c.tool, c.args)
		wantToolError(t, c.tool+" on another session", res, `works on session "demo" only`)
	}
	res, _ := call(t, cs, "create_session", map[string]any{"name": "new"})
	wantToolError(t, "create_session when confined", res, `works on session "demo" only`)
	_, out = call(t, cs, "list_sessions", map[string]any{})
	if b, _ := json.Marshal(out); strings.Contains(string(b), "other") {
		t.Errorf("list_sessions when confined = %s, want demo only", b)
	}
	// An execution of another session is not read either.
	p, err := f.Exec(t.Context(), "other", session.ExecRequest{Argv: []string{"echo", "secret"}})
	if err != nil {
		t.Fatal(err)
	}
	p.Wait(t.Context())
	res, _ = call(t, cs, "read_output", map[string]any{"exec_id": p.ID()})
	wantToolError(t, "read_output of another session's execution", res, `works on session "demo" only`)
	// Nor cancelled.
	p, err = f.Exec(t.Context(), "other", session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	res, _ = call(t, cs, "cancel", map[string]any{"exec_id": p.ID()})
	wantToolError(t, "cancel of another session's execution", res, `works on session "demo" only`)
	if n := f.Calls("Cancel"); n != 0 {
		t.Errorf("a confined cancel of another session's execution reached the service %d times", n)
	}
	f.Cancel(t.Context(), p.ID())
}

// cancel kills a command left running (its exec call abandoned) through
// the service call the TUI's K makes, and says how it ended.
func TestCancelTool(t *testing.T) {
	f := newFake(t)
	cs := connect(t, f, mcpserver.Options{})
	p, err := f.Exec(t.Context(), "demo", session.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	res, out := call(t, cs, "cancel", map[string]any{"exec_id": p.ID()})
	if res.IsError || out["exec_id"] != p.ID() || out["state"] != string(session.ExecCancelled) {
		t.Errorf("cancel = %s %v, want %s cancelled", text(res), out, p.ID())
	}
	if x, err := f.Execution(t.Context(), p.ID()); err != nil || x.State != session.ExecCancelled || f.Calls("Cancel") != 1 {
		t.Errorf("after cancel: %s, %v, %d Cancel calls", x.State, err, f.Calls("Cancel"))
	}
	res, _ = call(t, cs, "cancel", map[string]any{"exec_id": p.ID()})
	wantToolError(t, "cancel of an ended execution", res, "already ended")
	res, _ = call(t, cs, "cancel", map[string]any{"exec_id": "e9999"})
	wantToolError(t, "cancel of an unknown execution", res, "not found")
	res, _ = call(t, cs, "cancel", map[string]any{"exec_id": ""})
	wantToolError(t, "cancel without exec_id", res, "no exec_id given")
}

func TestViewerGetsReadTools(t *testing.T) {
	f := newFake(t)
	cs := connect(t, sshd.Restrict(f, sshd.Viewer), mcpserver.Options{})
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if want := []string{"list_files", "list_sessions", "read_file", "read_output", "run_diff", "session_info"}; !slices.Equal(names, want) {
		t.Errorf("a viewer's tools = %v, want %v", names, want)
	}
	r, _ := call(t, cs, "exec", map[string]any{"session": "demo", "command": "true"})
	wantToolError(t, "exec as a viewer", r, "may only read (role viewer)")
	if n := f.Calls("Exec"); n != 0 {
		t.Errorf("a viewer's exec reached the service %d times", n)
	}
	_, out := call(t, cs, "list_sessions", map[string]any{})
	if b, _ := json.Marshal(out); !strings.Contains(string(b), "demo") {
		t.Errorf("a viewer's list_sessions = %s", b)
	}
}

func TestRunEndsWithConnection(t *testing.T) {
	f := newFake(t)
	ctx := t.Context()
	st, ct := mcp.NewInMemoryTransports()
	srv := mcpserver.New(ctx, f, mcpserver.Options{})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "short", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	call(t, cs, "exec", map[string]any{"session": "demo", "command": "true"})
	cs.Close()
	if err := <-done; err != nil && err != io.EOF {
		t.Errorf("Serve: %v", err)
	}
	runs, _ := f.Runs(ctx, "demo")
	if len(runs) != 1 || runs[0].Status != session.RunOK {
		t.Errorf("runs after the client closed = %+v, want one ended ok", runs)
	}

	// With --run, calls count in the given run, which the connection's end
	// leaves open.
	r, _ := f.StartRun(ctx, "demo", session.RunOptions{Title: "harness"})
	cs2 := connect(t, f, mcpserver.Options{Run: r.ID})
	call(t, cs2, "exec", map[string]any{"session": "demo", "command": "true"})
	got, _ := f.GetRun(ctx, r.ID)
	if got.Executions != 1 {
		t.Errorf("run %s after an exec with --run = %+v", r.ID, got)
	}
	// Another session's calls go in a run of that session.
	if res, _ := call(t, cs2, "exec", map[string]any{"session": "other", "command": "true"}); res.IsError {
		t.Errorf("exec in another session with --run: %s", text(res))
	}
	if got, _ := f.GetRun(ctx, r.ID); got.Executions != 1 {
		t.Errorf("run %s counts an exec of another session: %+v", r.ID, got)
	}
	if runs, _ := f.Runs(ctx, "other"); len(runs) != 1 || runs[0].Executions != 1 {
		t.Errorf("runs of other = %+v, want the connection's own", runs)
	}
}

// TestMessageBound: a message over the bound ends the connection (it
// cannot be read, so it cannot be answered); nothing reaches the service.
func TestMessageBound(t *testing.T) {
	f := newFake(t)
	srv := mcpserver.New(t.Context(), f, mcpserver.Options{MaxMessage: 4096})
	in := strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"},"padding":"` + strings.Repeat("a", 8192) + `"}}` + "\n")
	var out strings.Builder
	done := make(chan error, 1)
	go func() { done <- srv.ServeStdio(t.Context(), in, &out) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "maximum") {
			t.Errorf("Serve of an oversized message = %v, want it refused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end on an oversized message")
	}
	if n := f.Calls("Exec") + f.Calls("List"); n != 0 {
		t.Errorf("%d calls reached the service", n)
	}
}

// forward_port returns a local URL that reaches the guest's port, for as
// long as the connection lasts; bad ports and a taken local port are tool
// errors.
func TestForwardPort(t *testing.T) {
	f := newFake(t)
	if err := f.Serve("demo", 8080, func(c net.Conn) {
		defer c.Close()
		// Read the request before answering: closing with it unread
		// would reset the connection under the client.
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		fmt.Fprint(c, "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	}); err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	srv := mcpserver.New(t.Context(), f, mcpserver.Options{})
	sctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, out := call(t, cs, "forward_port", map[string]any{"session": "demo", "port": 8080})
	if res.IsError {
		t.Fatalf("forward_port: %s", text(res))
	}
	url, _ := out["url"].(string)
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Errorf("GET %s = %q, want the guest's answer", url, body)
	}
	for _, args := range []map[string]any{{"session": "demo", "port": 0}, {"session": "demo", "port": 70000}, {"session": "demo", "port": 80, "local": -1}} {
		res, _ := call(t, cs, "forward_port", args)
		wantToolError(t, fmt.Sprint(args), res, "1 to 65535")
	}
	local := int(out["local"].(float64))
	res, _ = call(t, cs, "forward_port", map[string]any{"session": "demo", "port": 8080, "local": local})
	wantToolError(t, "a taken local port", res, "already in use")
	res, _ = call(t, cs, "forward_port", map[string]any{"session": "ghost", "port": 8080})
	wantToolError(t, "an unknown session", res, "ghost")

	cs.Close()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", local), time.Second); err == nil {
		c.Close()
		t.Error("the forward outlived its MCP connection")
	}
}

// TestRunDiffTool: a connection's run keeps its start (as run_checkpoint
// makes it) and run_diff shows what the agent changed.
func TestRunDiffTool(t *testing.T) {
	f := sessiontest.New(sessiontest.Options{KeepRuns: true})
	t.Cleanup(func() { f.Close() })
	if _, err := f.Create(t.Context(), session.CreateOptions{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(t.Context(), "demo", "a.txt", strings.NewReader("one\ntwo\n")); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, f, mcpserver.Options{Session: "demo"})
	res, _ := call(t, cs, "run_diff", map[string]any{})
	wantToolError(t, "run_diff before any change", res, "has changed nothing")
	call(t, cs, "edit_file", map[string]any{"path": "a.txt", "old_string": "two", "new_string": "TWO"})
	call(t, cs, "write_file", map[string]any{"path": "b.txt", "content": "new\n"})
	res, out := call(t, cs, "run_diff", map[string]any{"patch": true})
	if res.IsError {
		t.Fatalf("run_diff: %s", text(res))
	}
	b, _ := json.Marshal(out)
	for _, want := range []string{`"kind":"modified","new_mode":420`, `"path":"a.txt"`, `"path":"b.txt"`, `-two\n+TWO\n`, `"files":2`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("run_diff = %s, want %s", b, want)
		}
	}
	res, _ = call(t, cs, "run_diff", map[string]any{"paths": []string{"../etc"}})
	wantToolError(t, "run_diff of a path out of /workspace", res, "climbs")
}
