package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthvm/berth/session"
)

// Bounds of what a tool returns.
const (
	// DefaultOutputLimit bounds each of stdout and stderr in an exec
	// result: its head and tail are kept around a marker.
	DefaultOutputLimit = 32 << 10
	// maxReadFile bounds read_file's answer; a line range reads further.
	maxReadFile = 256 << 10
	// maxScanFile bounds how much of a file read_file and edit_file read.
	maxScanFile = 16 << 20
	// maxReadOutput bounds read_output's answer.
	maxReadOutput = 256 << 10
	// defaultExecTimeout and maxExecTimeout bound exec's wait.
	defaultExecTimeout = 10 * time.Minute
	maxExecTimeout     = 24 * time.Hour
)

// Tool arguments and results. The jsonschema tags are the schema's
// descriptions.

type sessionArg struct {
	Session string `json:"session,omitempty" jsonschema:"the session's name (may be left out when the server is confined to one)"`
}

type sessionSummary struct {
	Name          string        `json:"name"`
	State         session.State `json:"state"`
	Image         string        `json:"image"`
	CPUs          int           `json:"cpus"`
	MemoryMiB     int           `json:"memory_mib"`
	DiskBytes     int64         `json:"disk_bytes"`
	WorkspaceUsed int64         `json:"workspace_used"`
	Running       int           `json:"running"`
}

type listSessionsOut struct {
	Sessions []sessionSummary `json:"sessions"`
}

type createSessionIn struct {
	Name   string `json:"name" jsonschema:"the new session's name: 1-63 lowercase letters, digits and dashes"`
	Image  string `json:"image,omitempty" jsonschema:"image to run (default: the daemon's, usually mini)"`
	CPUs   int    `json:"cpus,omitempty" jsonschema:"virtual CPUs"`
	Memory string `json:"memory,omitempty" jsonschema:"memory, such as 512M or 2G"`
	Disk   string `json:"disk,omitempty" jsonschema:"size of the /workspace volume, such as 4G"`
	From   string `json:"from,omitempty" jsonschema:"make it from a checkpoint of another session: NAME@ID, or NAME for its newest (its image and disks are the checkpoint's; leave image and disk out)"`
}

type execIn struct {
	sessionArg
	Command        string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c (give this or argv)"`
	Argv           []string          `json:"argv,omitempty" jsonschema:"the program and its arguments, run without a shell (give this or command)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default /workspace)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables to set"`
	User           string            `json:"user,omitempty" jsonschema:"run as this user: NAME or UID, with an optional :GROUP or :GID (default: the image's user, else root)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 600)"`
}

type execOut struct {
	ExecID   string            `json:"exec_id" jsonschema:"the execution's id: read_output reads its whole output"`
	State    session.ExecState `json:"state"`
	ExitCode *int              `json:"exit_code,omitempty"`
	Signal   string            `json:"signal,omitempty"`
	Error    string            `json:"error,omitempty"`
	Stdout   string            `json:"stdout"`
	Stderr   string            `json:"stderr"`
	// Truncated says that stdout or stderr was cut (a marker shows where).
	Truncated   bool  `json:"truncated,omitempty"`
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
	// Notices are berth's words while it ran (its output held for lack of
	// room on the host, then stored again), not the command's.
	Notices []string `json:"notices,omitempty"`
}

type readOutputIn struct {
	ExecID   string `json:"exec_id" jsonschema:"the execution's id, as exec returned it"`
	FromSeq  int64  `json:"from_seq,omitempty" jsonschema:"the output chunk to start at (1, or next_seq of the previous call)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes (default and maximum 262144)"`
}

type readOutputOut struct {
	Stdout  string            `json:"stdout"`
	Stderr  string            `json:"stderr"`
	NextSeq int64             `json:"next_seq" jsonschema:"from_seq for the next call"`
	Done    bool              `json:"done" jsonschema:"true when this is all the output there will be"`
	State   session.ExecState `json:"state"`
	// Trimmed counts bytes retention dropped before the first chunk.
	Trimmed int64 `json:"trimmed,omitempty"`
}

type cancelIn struct {
	ExecID string `json:"exec_id" jsonschema:"the execution to cancel, as exec returned it"`
}

type cancelOut struct {
	ExecID string            `json:"exec_id"`
	State  session.ExecState `json:"state" jsonschema:"cancelled, or running while its end is not recorded yet"`
}

type readFileIn struct {
	sessionArg
	Path   string `json:"path" jsonschema:"the file, relative to /workspace or absolute under it"`
	Offset int    `json:"offset,omitempty" jsonschema:"first line to return, from 1"`
	Limit  int    `json:"limit,omitempty" jsonschema:"number of lines to return"`
}

type readFileOut struct {
	Content string `json:"content"`
	// Lines is the file's number of lines; Truncated says content stops
	// short of what was asked.
	Lines     int  `json:"lines"`
	Truncated bool `json:"truncated,omitempty"`
}

type writeFileIn struct {
	sessionArg
	Path    string `json:"path" jsonschema:"the file, relative to /workspace or absolute under it; parent directories must exist"`
	Content string `json:"content" jsonschema:"the file's whole new content"`
}

type writeFileOut struct {
	Written int64 `json:"written" jsonschema:"bytes written; the file is durable"`
}

type editFileIn struct {
	sessionArg
	Path      string `json:"path" jsonschema:"the file, relative to /workspace or absolute under it"`
	OldString string `json:"old_string" jsonschema:"the exact text to replace; it must occur exactly once"`
	NewString string `json:"new_string" jsonschema:"the text to put in its place"`
}

type editFileOut struct {
	Line    int   `json:"line" jsonschema:"the line the replaced text started on"`
	Written int64 `json:"written"`
}

type listFilesIn struct {
	sessionArg
	Path string `json:"path,omitempty" jsonschema:"the directory (default /workspace)"`
}

type fileEntry struct {
	Name  string    `json:"name"`
	Type  string    `json:"type" jsonschema:"file, dir or symlink"`
	Size  int64     `json:"size"`
	MTime time.Time `json:"mtime"`
	Link  string    `json:"link,omitempty"`
}

type listFilesOut struct {
	Entries []fileEntry `json:"entries"`
}

func (s *Server) addTools() {
	addTool(s, "list_sessions", "List berth sessions with their state and sizes.", session.ActionRead, s.listSessions)
	addTool(s, "session_info", "Describe one session: state, image, CPUs, memory, disk use, running commands.", session.ActionRead, s.sessionInfo)
	addTool(s, "read_output", "Read an execution's recorded output from a chunk sequence number; exec's result says when its output was cut.", session.ActionRead, s.readOutput)
	addTool(s, "read_file", "Read a text file in the session's /workspace, optionally a range of lines.", session.ActionRead, s.readFile)
	addTool(s, "list_files", "List a directory in the session's /workspace.", session.ActionRead, s.listFiles)
	addTool(s, "create_session", "Create a new session (a microVM with a durable /workspace) and wait until it runs.", session.ActionCreate, s.createSession)
	addTool(s, "exec", "Run a command in the session and wait for it: exit code, stdout and stderr (each cut to its head and tail when long; read_output has it all). The command is recorded and keeps running if the call is abandoned.", session.ActionExec, s.exec)
	addTool(s, "cancel", "Cancel a running command (one whose exec call was abandoned, or still runs): kills its whole process group, as berth's TUI and 'berth cancel' do. What it changed so far remains.", session.ActionCancel, s.cancel)
	addTool(s, "write_file", "Write a file in the session's /workspace, replacing it. Durable when it returns.", session.ActionWriteFile, s.writeFile)
	addTool(s, "edit_file", "Replace an exact string that occurs exactly once in a file; fails, changing nothing, when it is absent or occurs more than once.", session.ActionWriteFile, s.editFile)
	addTool(s, "forward_port", "Forward a host loopback port to a port in the session (a dev server the agent started); returns its local URL. The forward lasts as long as this MCP connection.", session.ActionNet, s.forwardPort)
	addTool(s, "run_diff", "What a run changed in /workspace since it started: files added, modified, removed and renamed, with sizes, modes and lines added and removed; with patch, unified diffs of text files. The run is this connection's own in the session unless one is named. Review your work with it before you finish.", session.ActionDiff, s.runDiff)
	addTool(s, "flush", "Flush the session's /workspace to its volume on the host, so a crash of the VM loses nothing written so far.", session.ActionFlush, s.flush)
}

// addTool offers a tool doing action a: its read-only hint is the action
// table's, and a read-only server (an SSH viewer's) offers only the tools
// that change nothing.
func addTool[In, Out any](s *Server, name, desc string, a session.Action, fn func(ctx context.Context, in In) (Out, error)) {
	if s.read && session.Mutates(a) {
		return
	}
	mcp.AddTool(s.srv, &mcp.Tool{Name: name, Description: desc, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: !session.Mutates(a)}}, handler(s, fn))
}

func summary(x session.Session) sessionSummary {
	return sessionSummary{Name: x.Name, State: x.State, Image: x.Image, CPUs: x.CPUs, MemoryMiB: x.MemoryMiB,
		DiskBytes: x.DiskBytes, WorkspaceUsed: x.WorkspaceUsed, Running: x.Running}
}

func (s *Server) listSessions(ctx context.Context, _ struct{}) (listSessionsOut, error) {
	out := listSessionsOut{Sessions: []sessionSummary{}}
	if s.opts.Session != "" {
		x, err := s.svc.Get(ctx, s.opts.Session)
		if err != nil {
			return out, err
		}
		out.Sessions = append(out.Sessions, summary(x))
		return out, nil
	}
	list, err := s.svc.List(ctx)
	if err != nil {
		return out, err
	}
	for _, x := range list {
		out.Sessions = append(out.Sessions, summary(x))
	}
	return out, nil
}

func (s *Server) sessionInfo(ctx context.Context, in sessionArg) (session.Session, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return session.Session{}, err
	}
	return s.svc.Get(ctx, name)
}

func (s *Server) createSession(ctx context.Context, in createSessionIn) (sessionSummary, error) {
	if s.opts.Session != "" {
		return sessionSummary{}, fmt.Errorf("this MCP server works on session %q only and cannot create others: %w", s.opts.Session, session.ErrPermission)
	}
	if err := session.ValidateName(in.Name); err != nil {
		return sessionSummary{}, err
	}
	opts := session.CreateOptions{Name: in.Name, Image: in.Image, CPUs: in.CPUs, From: in.From}
	var err error
	if in.Memory != "" {
		if opts.MemoryMiB, err = session.ParseMemory(in.Memory); err != nil {
			return sessionSummary{}, fmt.Errorf("memory %q: %v: %w", in.Memory, err, session.ErrInvalid)
		}
	}
	if in.Disk != "" {
		if opts.DiskBytes, err = session.ParseSize(in.Disk); err != nil {
			return sessionSummary{}, fmt.Errorf("disk %q: %v: %w", in.Disk, err, session.ErrInvalid)
		}
	}
	x, err := s.svc.Create(ctx, opts)
	if err != nil {
		return sessionSummary{}, err
	}
	return summary(x), nil
}

// checkPath refuses paths that leave /workspace before they reach the
// service (which refuses them too).
func checkPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains NUL: %w", p, session.ErrInvalid)
	}
	rel := p
	if path.IsAbs(p) {
		clean := path.Clean(p)
		if clean != "/workspace" && !strings.HasPrefix(clean, "/workspace/") {
			e := session.OutsideWorkspace(p)
			e.Hint = "the file tools work in /workspace only"
			return "", e
		}
		rel = strings.TrimPrefix(strings.TrimPrefix(clean, "/workspace"), "/")
	}
	rel = path.Clean("/" + rel)[1:]
	if c := path.Clean(p); !path.IsAbs(p) && (c == ".." || strings.HasPrefix(c, "../")) {
		return "", fmt.Errorf("path %q escapes /workspace: %w", p, session.ErrInvalid)
	}
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

func (s *Server) exec(ctx context.Context, in execIn) (execOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return execOut{}, err
	}
	var argv []string
	switch {
	case in.Command != "" && len(in.Argv) > 0:
		return execOut{}, fmt.Errorf("give command or argv, not both: %w", session.ErrInvalid)
	case in.Command != "":
		argv = []string{"sh", "-c", in.Command}
	case len(in.Argv) > 0 && in.Argv[0] != "":
		argv = in.Argv
	default:
		return execOut{}, fmt.Errorf("no command: give command (a shell command line) or argv: %w", session.ErrInvalid)
	}
	timeout := defaultExecTimeout
	if in.TimeoutSeconds < 0 {
		return execOut{}, fmt.Errorf("timeout_seconds %d: want a positive number: %w", in.TimeoutSeconds, session.ErrInvalid)
	}
	if in.TimeoutSeconds > 0 {
		timeout = min(time.Duration(in.TimeoutSeconds)*time.Second, maxExecTimeout)
	}
	ctx, err = s.inRun(ctx, name)
	if err != nil {
		return execOut{}, err
	}
	env := in.Env
	if len(env) == 0 {
		env = nil
	}
	// The command outlives this call: a client that goes away mid-exec
	// leaves it running and recorded. Only following its output stops.
	follow, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	p, err := s.svc.Exec(follow, name, session.ExecRequest{Argv: argv, Env: env, Cwd: in.Cwd, Timeout: timeout, User: in.User})
	if err != nil {
		return execOut{}, err
	}
	out := execOut{ExecID: p.ID()}
	stdout, stderr := newClip(s.opts.OutputLimit), newClip(s.opts.OutputLimit)
	chunks := p.Output()
collect:
	for {
		select {
		case c, ok := <-chunks:
			if !ok {
				break collect
			}
			switch c.Stream {
			case session.Notice:
				if len(out.Notices) < 16 {
					out.Notices = append(out.Notices, string(c.Data))
				}
			case session.Stderr:
				stderr.write(c.Data)
			default:
				stdout.write(c.Data)
			}
		case <-ctx.Done():
			return execOut{}, fmt.Errorf("the call ended before the command (execution %s goes on; read_output reads it): %w", p.ID(), ctx.Err())
		}
	}
	x, err := p.Wait(ctx)
	if err != nil {
		return execOut{}, fmt.Errorf("execution %s: %w", p.ID(), err)
	}
	out.State, out.ExitCode, out.Signal, out.Error = x.State, x.ExitCode, x.Signal, x.Error
	out.StdoutBytes, out.StderrBytes = x.StdoutBytes, x.StderrBytes
	out.Stdout = stdout.String("stdout", p.ID())
	out.Stderr = stderr.String("stderr", p.ID())
	out.Truncated = stdout.cut > 0 || stderr.cut > 0
	return out, nil
}

// clip keeps the head and the tail of a stream within limit bytes.
type clip struct {
	limit int
	head  []byte
	tail  []byte // a window of the last limit/2 bytes
	cut   int64  // bytes dropped between head and tail
}

func newClip(limit int) *clip { return &clip{limit: limit} }

func (c *clip) write(b []byte) {
	half := c.limit / 2
	if n := min(half-len(c.head), len(b)); n > 0 && c.cut == 0 && len(c.tail) == 0 {
		c.head = append(c.head, b[:n]...)
		b = b[n:]
	}
	c.tail = append(c.tail, b...)
	if over := len(c.tail) - (c.limit - half); over > 0 {
		c.cut += int64(over)
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
}

// String is the kept text, with a marker where bytes were dropped.
func (c *clip) String(stream, execID string) string {
	if c.cut == 0 {
		return string(c.head) + string(c.tail)
	}
	return fmt.Sprintf("%s\n[berth: %d bytes of %s omitted here; read_output with exec_id %q has all of it]\n%s",
		c.head, c.cut, stream, execID, c.tail)
}

// execution returns the record of execution id, refused when the server
// is confined to another session.
func (s *Server) execution(ctx context.Context, id string) (session.Execution, error) {
	if id == "" {
		return session.Execution{}, fmt.Errorf("no exec_id given: %w", session.ErrInvalid)
	}
	x, err := s.svc.Execution(ctx, id)
	if err != nil {
		return session.Execution{}, err
	}
	if s.opts.Session != "" && x.Session != s.opts.Session {
		return session.Execution{}, fmt.Errorf("execution %q is in session %q; this MCP server works on session %q only: %w", id, x.Session, s.opts.Session, session.ErrPermission)
	}
	return x, nil
}

// cancelWait bounds how long cancel waits for the killed command's end to
// be recorded.
const cancelWait = 10 * time.Second

func (s *Server) cancel(ctx context.Context, in cancelIn) (cancelOut, error) {
	x, err := s.execution(ctx, in.ExecID)
	if err != nil {
		return cancelOut{}, err
	}
	if err := s.svc.Cancel(ctx, x.ID); err != nil {
		return cancelOut{}, err
	}
	wctx, stop := context.WithTimeout(ctx, cancelWait)
	defer stop()
	if p, err := s.svc.Attach(wctx, x.ID, 0); err == nil {
		for range p.Output() {
		}
		if final, err := p.Wait(wctx); err == nil {
			x = final
		}
	}
	if !x.State.Done() {
		// It ended before the attach, or is still ending: the record says.
		if final, err := s.svc.Execution(wctx, x.ID); err == nil {
			x = final
		}
	}
	return cancelOut{ExecID: x.ID, State: x.State}, nil
}

func (s *Server) readOutput(ctx context.Context, in readOutputIn) (readOutputOut, error) {
	x, err := s.execution(ctx, in.ExecID)
	if err != nil {
		return readOutputOut{}, err
	}
	limit := maxReadOutput
	if in.MaxBytes > 0 {
		limit = min(in.MaxBytes, maxReadOutput)
	}
	from := uint64(max(in.FromSeq, 1))
	var stdout, stderr bytes.Buffer
	out := readOutputOut{State: x.State}
	for {
		page, err := s.svc.Output(ctx, in.ExecID, from, 256)
		if err != nil {
			return readOutputOut{}, err
		}
		if from == uint64(max(in.FromSeq, 1)) {
			out.Trimmed = page.Gap
		}
		full := false
		for _, c := range page.Chunks {
			if stdout.Len()+stderr.Len()+len(c.Data) > limit && stdout.Len()+stderr.Len() > 0 {
				full = true
				break
			}
			if c.Stream == session.Stderr {
				stderr.Write(c.Data)
			} else {
				stdout.Write(c.Data)
			}
			from = c.Seq + 1
		}
		if full || len(page.Chunks) == 0 {
			if !full && len(page.Chunks) == 0 && page.Next > from {
				from = page.Next
			}
			out.Done = !full && x.State.Done()
			break
		}
	}
	out.Stdout, out.Stderr, out.NextSeq = stdout.String(), stderr.String(), int64(from)
	return out, nil
}

// readAll reads a workspace file, at most maxScanFile bytes.
func (s *Server) readAll(ctx context.Context, name, p string) ([]byte, error) {
	rc, err := s.svc.ReadFile(ctx, name, p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxScanFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if len(b) > maxScanFile {
		return nil, fmt.Errorf("%s is over %d MiB: use exec (head, sed -n) to read parts of it: %w", p, maxScanFile>>20, session.ErrInvalid)
	}
	return b, nil
}

func (s *Server) readFile(ctx context.Context, in readFileIn) (readFileOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return readFileOut{}, err
	}
	p, err := checkPath(in.Path)
	if err != nil {
		return readFileOut{}, err
	}
	if in.Offset < 0 || in.Limit < 0 {
		return readFileOut{}, fmt.Errorf("offset and limit count lines from 1: %w", session.ErrInvalid)
	}
	b, err := s.readAll(ctx, name, p)
	if err != nil {
		return readFileOut{}, err
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return readFileOut{}, fmt.Errorf("%s is a binary file (it holds NUL bytes): use exec (od, base64) to read it: %w", in.Path, session.ErrInvalid)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	out := readFileOut{Lines: len(lines)}
	first, n := 1, len(lines)
	if in.Offset > 0 {
		first = in.Offset
	}
	if in.Limit > 0 {
		n = in.Limit
	}
	if first > len(lines) && len(lines) > 0 {
		return readFileOut{}, fmt.Errorf("%s has %d lines; offset %d is past its end: %w", in.Path, len(lines), first, session.ErrInvalid)
	}
	var sb strings.Builder
	for i := first - 1; i < len(lines) && i < first-1+n; i++ {
		if sb.Len()+len(lines[i]) > maxReadFile {
			out.Truncated = true
			break
		}
		sb.WriteString(lines[i])
	}
	out.Content = sb.String()
	return out, nil
}

func (s *Server) writeFile(ctx context.Context, in writeFileIn) (writeFileOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return writeFileOut{}, err
	}
	p, err := checkPath(in.Path)
	if err != nil {
		return writeFileOut{}, err
	}
	ctx, err = s.inRun(ctx, name)
	if err != nil {
		return writeFileOut{}, err
	}
	n, err := s.svc.WriteFile(ctx, name, p, strings.NewReader(in.Content))
	if err != nil {
		return writeFileOut{}, err
	}
	return writeFileOut{Written: n}, nil
}

func (s *Server) editFile(ctx context.Context, in editFileIn) (editFileOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return editFileOut{}, err
	}
	p, err := checkPath(in.Path)
	if err != nil {
		return editFileOut{}, err
	}
	if in.OldString == "" {
		return editFileOut{}, fmt.Errorf("old_string is empty: give the exact text to replace: %w", session.ErrInvalid)
	}
	if in.OldString == in.NewString {
		return editFileOut{}, fmt.Errorf("old_string and new_string are the same: nothing to change: %w", session.ErrInvalid)
	}
	b, err := s.readAll(ctx, name, p)
	if err != nil {
		return editFileOut{}, err
	}
	text := string(b)
	var at []int // lines where old_string starts
	for i := 0; ; {
		j := strings.Index(text[i:], in.OldString)
		if j < 0 {
			break
		}
		at = append(at, strings.Count(text[:i+j], "\n")+1)
		i += j + 1
		if len(at) > 10 {
			break
		}
	}
	switch {
	case len(at) == 0:
		return editFileOut{}, fmt.Errorf("%s does not contain old_string (it must match exactly, whitespace included); nothing changed: %w", in.Path, session.ErrNotFound)
	case len(at) > 1:
		var nums []string
		for _, l := range at[:min(len(at), 10)] {
			nums = append(nums, fmt.Sprint(l))
		}
		lines := strings.Join(nums, ", ")
		if len(at) > 10 {
			lines += " and more"
		}
		return editFileOut{}, fmt.Errorf("old_string occurs %s in %s (lines %s): include more context to make it unique; nothing changed: %w", times(len(at)), in.Path, lines, session.ErrConflict)
	}
	ctx, err = s.inRun(ctx, name)
	if err != nil {
		return editFileOut{}, err
	}
	next := strings.Replace(text, in.OldString, in.NewString, 1)
	n, err := s.svc.WriteFile(ctx, name, p, strings.NewReader(next))
	if err != nil {
		return editFileOut{}, err
	}
	return editFileOut{Line: at[0], Written: n}, nil
}

func times(n int) string {
	if n > 10 {
		return "more than 10 times"
	}
	return fmt.Sprintf("%d times", n)
}

func (s *Server) listFiles(ctx context.Context, in listFilesIn) (listFilesOut, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return listFilesOut{}, err
	}
	p := in.Path
	if p == "" {
		p = "."
	}
	if p, err = checkPath(p); err != nil {
		return listFilesOut{}, err
	}
	list, err := s.svc.ListDir(ctx, name, p)
	if err != nil {
		return listFilesOut{}, err
	}
	out := listFilesOut{Entries: make([]fileEntry, 0, len(list))}
	for _, fi := range list {
		typ := "file"
		switch {
		case fi.IsDir():
			typ = "dir"
		case fi.Link != "" || fi.Mode&fs.ModeSymlink != 0:
			typ = "symlink"
		}
		out.Entries = append(out.Entries, fileEntry{Name: fi.Name, Type: typ, Size: fi.Size, MTime: fi.ModTime, Link: fi.Link})
	}
	return out, nil
}

func (s *Server) flush(ctx context.Context, in sessionArg) (session.FlushResult, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return session.FlushResult{}, err
	}
	if _, err := s.inRun(ctx, name); err != nil {
		return session.FlushResult{}, err
	}
	return s.svc.Flush(ctx, name)
}

type runDiffIn struct {
	Session string   `json:"session,omitempty" jsonschema:"the session (default: the one this server works on)"`
	Run     string   `json:"run,omitempty" jsonschema:"a run id (default: this connection's run in the session)"`
	Paths   []string `json:"paths,omitempty" jsonschema:"limit the diff to these paths under /workspace and what is under them"`
	Patch   bool     `json:"patch,omitempty" jsonschema:"include unified diffs of text files"`
}

func (s *Server) runDiff(ctx context.Context, in runDiffIn) (session.Diff, error) {
	name, err := s.sessionFor(in.Session)
	if err != nil {
		return session.Diff{}, err
	}
	for _, p := range in.Paths {
		if _, err := session.CleanDiffPath(p); err != nil {
			return session.Diff{}, err
		}
	}
	run := in.Run
	if run == "" {
		s.mu.Lock()
		run = s.runs[name]
		s.mu.Unlock()
		if run == "" {
			return session.Diff{}, fmt.Errorf("this connection has changed nothing in session %q yet, so it has no run there: name one with run: %w", name, session.ErrInvalid)
		}
	}
	d, err := s.svc.RunDiff(ctx, run, session.DiffOptions{Paths: in.Paths, Patch: in.Patch})
	if err != nil {
		return d, err
	}
	// Patches are bounded as command output is: the counts stay whole.
	budget := s.opts.OutputLimit
	for i := range d.Changes {
		if len(d.Changes[i].Patch) > budget {
			d.Changes[i].Patch = d.Changes[i].Patch[:max(budget, 0)] + "\n[patch cut: ask for this path alone, or read the file]\n"
			budget = 0
			continue
		}
		budget -= len(d.Changes[i].Patch)
	}
	return d, nil
}
