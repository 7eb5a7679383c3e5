package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
	"github.com/berthvm/berth/guest/users"
)

const (
	// outBufSize bounds the unacknowledged output per stream. It is what a
	// disconnected host can catch up on without the command blocking.
	outBufSize = 4 << 20
	// keepFinished bounds how many finished executions the agent remembers
	// for a host that has not fetched their end yet.
	keepFinished = 64
	// drainGrace is how long output is still read after the command's
	// leader exited, for background children that hold the pipes open.
	drainGrace = 200 * time.Millisecond
)

// execution is one command the agent started.
type execution struct {
	id      string
	argv    []string
	started time.Time

	mu     sync.Mutex
	cond   *sync.Cond
	cmd    *exec.Cmd
	pid    int
	stdout *outBuf
	stderr *outBuf // nil with a PTY: the terminal merges the streams
	stdin  io.WriteCloser
	tty    *os.File
	cgroup string // cgroup directory, when the agent uses cgroups

	exited bool
	status syscall.WaitStatus
	ended  time.Time
	done   bool // exited and output drained
	forgot bool
}

func (e *execution) abandoned() bool { return e.forgot }

func (e *execution) infoLocked() guest.ExecInfo {
	in := guest.ExecInfo{
		ID: e.id, Pid: e.pid, Running: !e.done, Started: e.started,
		StdoutEnd: e.stdout.end, StdoutStart: e.stdout.start(),
	}
	if e.stderr != nil {
		in.StderrEnd, in.StderrStart = e.stderr.end, e.stderr.start()
	}
	if e.done {
		in.Ended = e.ended
		if e.status.Signaled() {
			in.ExitCode = -1
			in.Signal = unix.SignalName(e.status.Signal())
		} else {
			in.ExitCode = e.status.ExitStatus()
		}
	}
	return in
}

// execTable owns every execution and reaps their processes.
type execTable struct {
	a  *Agent
	mu sync.Mutex
	m  map[string]*execution
	// byPid routes exit statuses found by the PID 1 reaper. Processes are
	// started and registered under mu, and the reaper looks pids up under
	// mu, so a child that exits at once is still found.
	byPid map[int]*execution
}

func newExecTable(a *Agent) *execTable {
	return &execTable{a: a, m: map[string]*execution{}, byPid: map[int]*execution{}}
}

func (t *execTable) get(id string) (*execution, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if !ok {
		return nil, fmt.Errorf("execution %q: %w", id, guest.ErrUnknownExec)
	}
	return e, nil
}

func (t *execTable) list() []guest.ExecInfo {
	t.mu.Lock()
	es := make([]*execution, 0, len(t.m))
	for _, e := range t.m {
		es = append(es, e)
	}
	t.mu.Unlock()
	out := make([]guest.ExecInfo, 0, len(es))
	for _, e := range es {
		e.mu.Lock()
		out = append(out, e.infoLocked())
		e.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}

func (t *execTable) running() []*execution {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*execution
	for _, e := range t.m {
		e.mu.Lock()
		if !e.done {
			out = append(out, e)
		}
		e.mu.Unlock()
	}
	return out
}

// cwdError says what is wrong with a command's working directory dir
// (asked for as asked), or returns nil when nothing is: a start that fails
// on it would otherwise blame the program ("exec pwd: no such file or
// directory"). It is asked only once a start failed, so a start that
// succeeds costs no extra stat.
func cwdError(asked, dir string) error {
	shown := asked
	switch {
	case shown == "":
		shown = "/workspace"
	case !filepath.IsAbs(shown):
		shown = filepath.Join("/workspace", shown)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return &guest.Error{Code: "ENOENT", Message: fmt.Sprintf("working directory %s does not exist", shown)}
	case errors.Is(err, syscall.ENOTDIR), err == nil && !fi.IsDir():
		return &guest.Error{Code: "ENOTDIR", Message: fmt.Sprintf("working directory %s is not a directory", shown)}
	case errors.Is(err, os.ErrPermission):
		return &guest.Error{Code: "EACCES", Message: fmt.Sprintf("working directory %s cannot be entered: permission denied", shown)}
	}
	return nil
}

// start runs req. An id the table already knows returns that execution, so
// a host retrying a start whose reply it lost does not run the command twice.
// lookPathIn finds a command named without a slash in the PATH of the
// environment it runs with (an image's own PATH can name directories
// the agent's does not); false leaves the agent's lookup to answer.
func lookPathIn(file string, env []string) (string, bool) {
	if file == "" || strings.Contains(file, "/") {
		return "", false
	}
	var path string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // a relative PATH entry is the workspace's, not the image's
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

func (t *execTable) start(req *guest.ExecRequest) (*execution, bool, error) {
	if req.ID == "" || len(req.ID) > 64 || strings.ContainsAny(req.ID, "/\x00") {
		return nil, false, &guest.Error{Code: guest.CodeBadRequest, Op: "exec", Message: "execution id must be 1-64 characters without '/'"}
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, false, &guest.Error{Code: guest.CodeBadRequest, Op: "exec", Message: "no command given"}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.m[req.ID]; ok {
		return e, false, nil
	}
	e := &execution{id: req.ID, argv: req.Argv, started: time.Now(), stdout: newOutBuf(outBufSize)}
	e.cond = sync.NewCond(&e.mu)

	var user *users.User
	if req.User != "" {
		u, err := t.a.lookupUser("exec", req.User)
		if err != nil {
			return nil, false, err
		}
		user = &u
	}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = t.a.env(req, user)
	if p, ok := lookPathIn(req.Argv[0], cmd.Env); ok {
		cmd.Path, cmd.Err = p, nil
	}
	cmd.Dir = t.a.cwd(req.Cwd)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var closeAfter []io.Closer
	defer func() {
		for _, c := range closeAfter {
			c.Close()
		}
	}()
	var outR, errR *os.File
	if req.TTY {
		ptmx, tty, err := pty.Open()
		if err != nil {
			return nil, false, guest.ErrorFrom("exec", "", fmt.Errorf("open pty: %w", err))
		}
		if req.Rows > 0 && req.Cols > 0 {
			pty.Setsize(ptmx, &pty.Winsize{Rows: uint16(req.Rows), Cols: uint16(req.Cols)})
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		closeAfter = append(closeAfter, tty)
		e.tty, e.stdin, outR = ptmx, ptmx, ptmx
	} else {
		e.stderr = newOutBuf(outBufSize)
		or, ow, err := os.Pipe()
		if err != nil {
			return nil, false, guest.ErrorFrom("exec", "", err)
		}
		er, ew, err := os.Pipe()
		if err != nil {
			or.Close()
			ow.Close()
			return nil, false, guest.ErrorFrom("exec", "", err)
		}
		// A large pipe lets a fast writer run ahead while the agent ships
		// the previous batch; under emulation every wakeup is costly.
		// (Through SyscallConn: Fd would switch the pipe to blocking mode,
		// and read deadlines are needed to stop draining it.)
		if rc, err := or.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
		}
		cmd.Stdout, cmd.Stderr = ow, ew
		closeAfter = append(closeAfter, ow, ew)
		outR, errR = or, er
		if req.Stdin {
			ir, iw, err := os.Pipe()
			if err != nil {
				return nil, false, guest.ErrorFrom("exec", "", err)
			}
			cmd.Stdin = ir
			closeAfter = append(closeAfter, ir)
			e.stdin = iw
		}
	}
	if user != nil {
		groups := make([]uint32, len(user.Groups))
		for i, g := range user.Groups {
			groups[i] = uint32(g)
		}
		// Groups is set (empty or not), so the agent's own supplementary
		// groups are never inherited.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(user.UID), Gid: uint32(user.GID), Groups: groups}
	}
	if cg := t.a.newCgroup(req.ID); cg != nil {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
		closeAfter = append(closeAfter, cg)
		e.cgroup = cg.Name()
	}
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{outR, errR} {
			if f != nil {
				f.Close()
			}
		}
		if e.stdin != nil {
			e.stdin.Close()
		}
		if e.cgroup != "" {
			os.Remove(e.cgroup)
		}
		if werr := cwdError(req.Cwd, cmd.Dir); werr != nil {
			return nil, false, werr
		}
		return nil, false, guest.ErrorFrom("exec", req.Argv[0], err)
	}
	e.cmd, e.pid = cmd, cmd.Process.Pid
	t.m[req.ID] = e
	t.byPid[e.pid] = e
	t.trimLocked()

	var pumps sync.WaitGroup
	read := func(f *os.File) func([]byte) (int, error) {
		return func(p []byte) (int, error) {
			n, err := f.Read(p)
			if err != nil && errors.Is(err, syscall.EIO) && req.TTY {
				err = io.EOF // the terminal's last writer closed it
			}
			return n, err
		}
	}
	pumps.Go(func() { pump(&e.mu, e.cond, e.stdout, read(outR), e.abandoned) })
	if errR != nil {
		pumps.Go(func() { pump(&e.mu, e.cond, e.stderr, read(errR), e.abandoned) })
	}
	go t.finish(e, &pumps, outR, errR)
	if !t.a.reaper {
		go func() {
			var st syscall.WaitStatus
			for {
				_, err := syscall.Wait4(e.pid, &st, 0, nil)
				if err != syscall.EINTR {
					break
				}
			}
			e.exit(st)
		}()
	}
	return e, true, nil
}

// pending is how many bytes wait unread in a pipe or terminal (0 if that
// cannot be told).
func pending(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		// TIOCINQ is FIONREAD: it counts a pipe's and a terminal's unread bytes.
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil && v > 0 {
			n = v
		}
	})
	return n
}

func (e *execution) exit(st syscall.WaitStatus) {
	e.mu.Lock()
	e.exited, e.status, e.ended = true, st, time.Now()
	e.cond.Broadcast()
	e.mu.Unlock()
}

// finish waits for the leader's exit and the pipes' end, then marks the
// execution done. Background children may keep the pipes open forever, so
// after the leader exits output is read only for drainGrace more — but
// never less than what the pipes held when it exited: that output was
// written by the command itself, and a pump held back by a host slow to
// acknowledge (4 MiB in flight on a loaded machine) can take longer than
// the grace to reach it. Cutting it there lost the tail of an exit-0
// command's output with no sign.
func (t *execTable) finish(e *execution, pumps *sync.WaitGroup, outR, errR *os.File) {
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()

	e.mu.Lock()
	for !e.exited {
		e.cond.Wait()
	}
	outOwed := e.stdout.end + int64(pending(outR))
	var errOwed int64
	if errR != nil {
		errOwed = e.stderr.end + int64(pending(errR))
	}
	e.mu.Unlock()
	owed := func() bool { // under e.mu
		return e.stdout.end < outOwed && !e.stdout.closed ||
			errR != nil && e.stderr.end < errOwed && !e.stderr.closed
	}
	select {
	case <-drained:
	case <-time.After(drainGrace):
		e.mu.Lock()
		for owed() && !e.abandoned() {
			e.cond.Wait()
		}
		e.mu.Unlock()
		// Unblock the pumps: a closed read end makes a lingering writer
		// get SIGPIPE, as it would after an ssh session ends.
		outR.SetReadDeadline(time.Now())
		if errR != nil {
			errR.SetReadDeadline(time.Now())
		}
		<-drained
	}
	outR.Close()
	if errR != nil {
		errR.Close()
	}
	e.mu.Lock()
	if e.stdin != nil {
		e.stdin.Close()
	}
	e.done = true
	e.cond.Broadcast()
	e.mu.Unlock()
	if e.cgroup != "" {
		os.Remove(e.cgroup) // fails while stragglers live; harmless
	}
	t.mu.Lock()
	delete(t.byPid, e.pid)
	t.trimLocked()
	t.mu.Unlock()
}

// trimLocked forgets the oldest finished executions beyond keepFinished.
func (t *execTable) trimLocked() {
	var finished []*execution
	for _, e := range t.m {
		e.mu.Lock()
		if e.done {
			finished = append(finished, e)
		}
		e.mu.Unlock()
	}
	if len(finished) <= keepFinished {
		return
	}
	sort.Slice(finished, func(i, j int) bool { return finished[i].started.Before(finished[j].started) })
	for _, e := range finished[:len(finished)-keepFinished] {
		delete(t.m, e.id)
	}
}

func (t *execTable) forget(id string) error {
	t.mu.Lock()
	e, ok := t.m[id]
	if ok {
		delete(t.m, id)
	}
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("execution %q: %w", id, guest.ErrUnknownExec)
	}
	e.mu.Lock()
	e.forgot = true
	e.cond.Broadcast()
	e.mu.Unlock()
	return nil
}

// signal sends sig to the execution's whole process group, and with
// SIGKILL also kills its cgroup, which catches children that left the group.
func (e *execution) signal(sig syscall.Signal) error {
	e.mu.Lock()
	done, pid, cg := e.done, e.pid, e.cgroup
	e.mu.Unlock()
	if done {
		return nil
	}
	err := syscall.Kill(-pid, sig)
	if sig == syscall.SIGKILL && cg != "" {
		if werr := os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0); werr == nil {
			err = nil
		}
	}
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

// reap is PID 1's zombie collector: every child, ours or orphaned, is
// reaped here, and statuses of executions are routed to them.
func (t *execTable) reap(sigchld <-chan os.Signal, stop <-chan struct{}) {
	for {
		for {
			var st syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
			t.mu.Lock()
			e, ok := t.byPid[pid] // not found: an orphan, now reaped
			t.mu.Unlock()
			if ok {
				e.exit(st)
			}
		}
		select {
		case <-sigchld:
		case <-stop:
			return
		}
	}
}

// lookupUser resolves a command's user, or the owner of what a file call
// creates (op says which), against the root's passwd and group files,
// read up to users.MaxFile bytes each (a missing file is an empty one:
// root and bare uids still resolve).
func (a *Agent) lookupUser(op, spec string) (users.User, error) {
	etc := a.cfg.Etc
	if etc == "" {
		etc = "/etc"
	}
	read := func(name string) []byte {
		f, err := os.Open(filepath.Join(etc, name))
		if err != nil {
			return nil
		}
		defer f.Close()
		b, _ := io.ReadAll(io.LimitReader(f, users.MaxFile))
		return b
	}
	u, err := users.Lookup(spec, read("passwd"), read("group"))
	what := "run as"
	if op != "exec" {
		what = "give files to"
	}
	var unknown *users.UnknownError
	switch {
	case errors.As(err, &unknown):
		return u, &guest.Error{Code: "ENOENT", Op: op, Message: fmt.Sprintf("cannot %s %s %q: the VM's %s does not have it", what, unknown.Kind, unknown.Name, filepath.Join(etc, unknown.File()))}
	case err != nil:
		return u, &guest.Error{Code: guest.CodeBadRequest, Op: op, Message: err.Error()}
	}
	return u, nil
}

// fileOwner is whom a file call's new files belong to: its user, resolved
// as a command's is, so what the session's user cannot write is never
// made for it. nil for "" or root (0:0), who makes them anyway.
func (a *Agent) fileOwner(op, spec string) (*tree.Owner, error) {
	if spec == "" {
		return nil, nil
	}
	u, err := a.lookupUser(op, spec)
	if err != nil {
		return nil, err
	}
	if u.UID == 0 && u.GID == 0 {
		return nil, nil
	}
	return &tree.Owner{UID: u.UID, GID: u.GID}, nil
}
