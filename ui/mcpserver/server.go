// Package mcpserver serves berth's provided tools over the Model Context
// Protocol (the official Go SDK), the convention coding agents use to reach
// a sandbox: list_sessions, create_session, session_info, exec, cancel,
// read_output, read_file, write_file, edit_file, list_files, forward_port,
// flush and run_diff (what the connection's run changed, from the
// starting point it keeps when the daemon's run_checkpoint is set).
//
// One connection is one agent run, titled from the client's name, opened
// on the first call that changes something and ended when the client
// closes the connection with nothing running in it (a command still
// running then leaves the run open; the daemon ends it as abandoned after
// its run timeout). Every failure is a tool error carrying berth's
// one-line message, never a protocol failure.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthvm/berth/session"
)

// DefaultMaxMessage bounds one inbound MCP message; a larger one ends the
// connection (it cannot be read, so it cannot be answered).
const DefaultMaxMessage = 8 << 20

// Options configure a server.
type Options struct {
	// Session confines the tools to one session: they take it as the
	// default and refuse any other.
	Session string
	// Run makes the connection's calls count in this existing run instead
	// of one of its own.
	Run string
	// Version is reported to clients.
	Version string
	// MaxMessage bounds one inbound message; 0 means DefaultMaxMessage.
	MaxMessage int
	// OutputLimit bounds each of stdout and stderr in an exec result; 0
	// means DefaultOutputLimit.
	OutputLimit int
}

// ReadOnly is implemented by a Service whose caller may only read (the SSH
// server's view for a viewer key); such a caller gets the read tools only.
type ReadOnly interface {
	ReadOnly(ctx context.Context) bool
}

// The tools that change nothing, and those that do.
var (
	readTools  = []string{"list_sessions", "session_info", "read_output", "read_file", "list_files", "run_diff"}
	writeTools = []string{"create_session", "exec", "cancel", "write_file", "edit_file", "forward_port", "flush"}
)

// Server is one MCP connection's tools over a session.Service.
type Server struct {
	svc  session.Service
	hx   session.Harness // nil: the service keeps no runs
	opts Options
	srv  *mcp.Server
	read bool // read tools only
	fwd  *forwards

	// mu is held across the Manager's StartRun (which takes the harness's
	// and the store's locks): the engine never calls back into this
	// server, and forwards.mu is never taken under it.
	mu     sync.Mutex
	runs   map[string]string // session → the connection's run in it
	own    map[string]bool   // runs this server opened (and ends)
	client string            // the client's name, from initialize
}

// New returns a server of svc's tools.
func New(ctx context.Context, svc session.Service, opts Options) *Server {
	if opts.MaxMessage == 0 {
		opts.MaxMessage = DefaultMaxMessage
	}
	if opts.OutputLimit == 0 {
		opts.OutputLimit = DefaultOutputLimit
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	s := &Server{svc: svc, opts: opts, runs: map[string]string{}, own: map[string]bool{}, fwd: newForwards()}
	s.hx = svc
	if ro, ok := svc.(ReadOnly); ok && ro.ReadOnly(ctx) {
		s.read = true
	}
	instructions := "berth sessions are VM-isolated work environments with a durable /workspace. Paths are relative to /workspace (or absolute under it)."
	if opts.Session != "" {
		instructions += fmt.Sprintf(" This server works on session %q only; the session argument may be left out.", opts.Session)
	}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "berth", Title: "berth sessions", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
	})
	s.addTools()
	s.srv.AddReceivingMiddleware(s.unknownTools)
	return s
}

// Tools lists the names of the tools this server offers.
func (s *Server) Tools() []string {
	if s.read {
		return slices.Clone(readTools)
	}
	return append(slices.Clone(readTools), writeTools...)
}

// Serve serves one connection over t until the client closes it or ctx
// ends, then ends the connection's own run if nothing runs in it.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	err := s.srv.Run(ctx, t)
	s.fwd.close()
	s.finish(context.WithoutCancel(ctx))
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Stdio serves svc's tools on r and w until ctx ends or the client
// leaves: New and ServeStdio in one call, the berth mcp command's
// (cli.Env.MCP), confined to session name unless it is "" and within
// run unless it is "".
func Stdio(ctx context.Context, svc session.Service, name, run string, r io.Reader, w io.Writer) error {
	return New(ctx, svc, Options{Session: name, Run: run}).ServeStdio(ctx, r, w)
}

// ServeStdio serves one connection over r and w (newline-delimited JSON).
func (s *Server) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	err := s.Serve(ctx, &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopCloser{w}, MaxLineLength: s.opts.MaxMessage})
	if err != nil && strings.Contains(err.Error(), "maximum line length") {
		return fmt.Errorf("a message over the maximum of %d bytes ended the connection (send large files in parts, or with berth put): %w", s.opts.MaxMessage, err)
	}
	return err
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// finish ends the runs this server opened, unless a command still runs in
// one: then the daemon ends it as abandoned after the run timeout.
func (s *Server) finish(ctx context.Context) {
	if s.hx == nil {
		return
	}
	s.mu.Lock()
	var own []string
	for id := range s.own {
		own = append(own, id)
	}
	s.mu.Unlock()
next:
	for _, run := range own {
		r, err := s.hx.GetRun(ctx, run)
		if err != nil || r.Status != session.RunOpen {
			continue
		}
		for _, id := range r.ExecIDs {
			if x, err := s.svc.Execution(ctx, id); err == nil && !x.State.Done() {
				continue next
			}
		}
		s.hx.EndRun(ctx, run, session.RunOK)
	}
}

// inRun returns ctx for a call that changes something in session name: in
// the connection's run in that session, opened on first use (or the run
// Options.Run names, in its session).
func (s *Server) inRun(ctx context.Context, name string) (context.Context, error) {
	if s.hx == nil {
		return ctx, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Run != "" {
		if _, known := s.own[s.opts.Run]; !known {
			r, err := s.hx.GetRun(ctx, s.opts.Run)
			if err != nil {
				return ctx, err
			}
			s.runs[r.Session], s.own[r.ID] = r.ID, false
		}
	}
	run, ok := s.runs[name]
	if !ok {
		title := "MCP"
		if s.client != "" {
			title = "MCP: " + s.client
		}
		r, err := s.hx.StartRun(ctx, name, session.RunOptions{Title: title})
		if err != nil {
			return ctx, err
		}
		run = r.ID
		s.runs[name], s.own[run] = run, true
	}
	return session.WithRun(ctx, run), nil
}

// sessionFor resolves a tool's session argument.
func (s *Server) sessionFor(arg string) (string, error) {
	switch {
	case s.opts.Session != "" && arg != "" && arg != s.opts.Session:
		return "", fmt.Errorf("this MCP server works on session %q only, not %q (it was started with --session %s): %w", s.opts.Session, arg, s.opts.Session, session.ErrPermission)
	case s.opts.Session != "":
		return s.opts.Session, nil
	case arg == "":
		return "", fmt.Errorf("no session given: pass \"session\" (list_sessions shows them): %w", session.ErrInvalid)
	}
	return arg, session.ValidateName(arg)
}

// unknownTools answers a call of a tool this server does not have with a
// tool error naming those it has, instead of a protocol error.
func (s *Server) unknownTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		ctr, ok := req.(*mcp.CallToolRequest)
		if !ok || ctr.Params == nil {
			return next(ctx, method, req)
		}
		name := ctr.Params.Name
		if slices.Contains(s.Tools(), name) {
			return next(ctx, method, req)
		}
		msg := fmt.Sprintf("unknown tool %q: the tools are %s", name, strings.Join(s.Tools(), ", "))
		if slices.Contains(writeTools, name) {
			msg = fmt.Sprintf("tool %q changes sessions, and this caller may only read (role viewer): the tools are %s", name, strings.Join(s.Tools(), ", "))
		}
		res := &mcp.CallToolResult{}
		res.SetError(errors.New(msg))
		return res, nil
	}
}

// toolError is err as a tool error: berth's one-line message, naming the
// field at fault as the tool's argument.
func toolError(err error) error {
	msg := strings.TrimSpace(session.Render(err, argOf))
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i] + " …"
	}
	return errors.New(msg)
}

// handler adapts a typed tool function: errors become tool errors with
// berth's one-line message.
func handler[In, Out any](s *Server, fn func(ctx context.Context, in In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		if req != nil && req.Session != nil {
			if p := req.Session.InitializeParams(); p != nil && p.ClientInfo != nil {
				s.mu.Lock()
				s.client = p.ClientInfo.Name
				s.mu.Unlock()
			}
		}
		out, err := fn(ctx, in)
		if err != nil {
			var zero Out
			return nil, zero, toolError(err)
		}
		return nil, out, nil
	}
}

// argOf names a field of the contract's errors as the tools' argument.
func argOf(field string) string {
	switch field {
	case session.FieldKeepMemory:
		return "argument memory (of a checkpoint):"
	case session.FieldSpec, session.FieldCheckpoint, session.FieldRun, session.FieldIdleTimeout, session.FieldSystemDisk, session.FieldNet, session.FieldLabel:
		return field // no tool takes it: named as the contract does
	}
	return "argument " + field + ":"
}
