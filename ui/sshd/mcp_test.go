package sshd

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	gossh "golang.org/x/crypto/ssh"
)

// mcpOverSSH runs "mcp ARGS" on an SSH session channel and connects the
// SDK's client to it.
func mcpOverSSH(t *testing.T, c *gossh.Client, args string) *mcp.ClientSession {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	if err := sess.Start("mcp " + args); err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "ssh-agent", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.IOTransport{Reader: io.NopCloser(stdout), Writer: stdin}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		sess.Close()
	})
	return cs
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

func TestMCPOverSSH(t *testing.T) {
	viewer, op := newKey(t, "vera", Viewer), newKey(t, "otto", Operator)
	w := newWorld(t, worldOpts{}, viewer, op)
	w.create("demo", "other")

	t.Run("viewer", func(t *testing.T) {
		cs := mcpOverSSH(t, w.dial(viewer), "--session demo")
		if got, want := toolNames(t, cs), []string{"list_files", "list_sessions", "read_file", "read_output", "run_diff", "session_info"}; !slices.Equal(got, want) {
			t.Errorf("a viewer's tools = %v, want %v", got, want)
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "true"}})
		if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "role viewer") {
			t.Errorf("exec as a viewer = %+v, %v; want a tool error naming the role", res, err)
		}
		if n := w.fake.Calls("Exec"); n != 0 {
			t.Errorf("the viewer's exec reached the service %d times", n)
		}
	})

	t.Run("operator", func(t *testing.T) {
		cs := mcpOverSSH(t, w.dial(op), "--session demo")
		if got := toolNames(t, cs); len(got) != 13 {
			t.Errorf("an operator's tools = %v, want all 13", got)
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"command": "echo hi"}})
		if err != nil || res.IsError {
			t.Fatalf("exec as an operator = %+v, %v", res, err)
		}
		res, _ = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"session": "other", "command": "true"}})
		if !res.IsError {
			t.Errorf("exec outside --session succeeded")
		}
		xs, _ := w.fake.Executions(t.Context(), "demo", true)
		if len(xs) != 1 || xs[0].By != "ssh:otto" {
			t.Errorf("executions = %+v, want one by ssh:otto", xs)
		}
		runs, _ := w.fake.Runs(t.Context(), "demo")
		if len(runs) != 1 || runs[0].Title != "MCP: ssh-agent" || runs[0].By != "ssh:otto" || runs[0].Executions != 1 {
			t.Errorf("runs = %+v, want the connection's, by ssh:otto", runs)
		}
	})

	t.Run("viewer reads runs but may not start one", func(t *testing.T) {
		vc := w.dial(viewer)
		r := run(t, vc, "runs demo", "")
		if r.code != 0 || !strings.Contains(r.stdout, "MCP: ssh-agent") {
			t.Errorf("runs as a viewer = %+v", r)
		}
		r = run(t, vc, "run start demo", "")
		if r.code == 0 || !strings.Contains(r.stderr, "may not start or end agent runs") {
			t.Errorf("run start as a viewer = %+v", r)
		}
		if runs, _ := w.fake.Runs(t.Context(), "demo"); len(runs) != 1 {
			t.Errorf("runs after a viewer's run start = %+v, want the one", runs)
		}
	})
}
