package cli

import (
	"context"
	"flag"
	"fmt"
)

func mcpCmd() *Command {
	return &Command{
		Name: "mcp", Group: "Agent runs and schedules", Usage: "[--session NAME] [--run ID]",
		Summary: "give a coding agent berth's tools over MCP on stdin and stdout",
		Help: `Speaks the Model Context Protocol (newline-delimited JSON-RPC) on stdin and stdout, for
an agent to reach berth sessions: list_sessions, create_session, session_info, exec,
cancel, read_output, read_file, write_file, edit_file, list_files, forward_port and flush. Over SSH
('ssh -p 2222 berth@HOST mcp') the key's role applies: a viewer gets the read tools only.
With --session the tools work on that session only and refuse any other. The connection
is one agent run, titled from the client's name (--run ID uses an existing one); it ends
when the client disconnects with nothing running in it, else it is ended as abandoned
after the daemon's run_timeout. Failures are tool errors with berth's one-line messages.`,
		Example: "berth mcp --session demo\nssh -p 2222 berth@HOST mcp --session demo",
		Setup: func(fs *flag.FlagSet) RunFunc {
			name := fs.String("session", "", "confine the tools to session `NAME`")
			run := runFlag(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				if c.env.MCP == nil {
					return fmt.Errorf("this berth has no MCP server: run berth-host mcp, or berth mcp with berth-host next to berth")
				}
				if *name != "" {
					if err := checkName(*name); err != nil {
						return err
					}
				}
				if _, err := inRun(ctx, *run); err != nil {
					return err
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if *name != "" {
					if _, err := svc.Get(ctx, *name); err != nil {
						return err
					}
				}
				if *run != "" {
					r, err := svc.GetRun(ctx, *run)
					if err != nil {
						return err
					}
					if *name != "" && r.Session != *name {
						return usageErrorf("--run %s is a run of session %q, not %q", *run, r.Session, *name)
					}
				}
				if err := c.env.MCP(ctx, svc, *name, *run, c.env.Stdin, c.env.Stdout); err != nil {
					return fmt.Errorf("mcp: %w", err)
				}
				return nil
			}
		},
	}
}
