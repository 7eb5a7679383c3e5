// Package agent is berth's guest agent: PID 1 inside every VM. It mounts the
// workspace, then serves the host over the agent channel: executions with
// streamed, resumable output; a durable file API confined to /workspace;
// flush, stats and shutdown.
//
// The same code runs in host tests with a temporary directory standing in
// for /workspace and without the PID 1 duties.
package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/tree"
	"github.com/berthvm/berth/guest/users"
)

// Config configures an Agent. The zero value serves a test agent with no
// workspace.
type Config struct {
	// Workspace is the directory served as /workspace. Empty means the
	// workspace is not mounted and every exec or file call fails.
	Workspace string
	// WorkspaceError says why the workspace is not mounted.
	WorkspaceError string
	// Device and UUID describe the mounted volume, for Hello.
	Device, UUID string
	// Home is HOME for commands (on the VM's own disk, not durable).
	Home string
	// PID1 enables the init duties: reaping orphans, per-execution cgroups,
	// power off on shutdown, setting the clock.
	PID1 bool
	// Build identifies the agent binary.
	Build  string
	Logger *slog.Logger
	// PowerOff is called after a successful shutdown; nil does nothing.
	PowerOff func()
	// Mount mounts what a VM restored from a template is given after the
	// restore: the system disk (switching to the root overlay) and the
	// workspace. Nil refuses mount requests.
	Mount func(spec guest.MountSpec) (Mounted, error)
	// System is the system disk's root directory, open, when the VM booted
	// into a root overlay; SystemInfo describes it (or says why there is
	// none).
	System     *os.File
	SystemInfo guest.Workspace
	// Hostname is the VM's hostname, for Hello.
	Hostname string
	// Etc is where the passwd and group files that name the users
	// commands run as are read ("": /etc, the root's).
	Etc string
	// Proxy and DNS are the guest addresses ServeNet listens on for the
	// egress proxy and the DNS server ("": not served). With Proxy set,
	// commands get http_proxy, https_proxy and no_proxy.
	Proxy, DNS string
}

// Mounted is what Config.Mount mounted.
type Mounted struct {
	Workspace, Device string // the workspace's directory and device
	System            *os.File
	SystemDevice      string
}

// Agent serves the host.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	booted time.Time
	execs  *execTable
	reaper bool

	mu      sync.Mutex
	root    *os.Root // nil until the workspace is mounted
	ws      guest.Workspace
	wsDir   string
	sys     *os.File // the system disk's root directory, or nil
	sysInfo guest.Workspace
	host    string
	closing bool
	handles map[*handle]struct{} // files open for the host
	tr      *tracker             // change records (track.go), made on first use

	sessMu  sync.Mutex
	current *yamux.Session // at most one host session at a time
}

// New returns an agent. It opens the workspace directory when configured.
func New(cfg Config) (*Agent, error) {
	a := &Agent{cfg: cfg, log: cfg.Logger, booted: time.Now(), reaper: cfg.PID1}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.cfg.Home == "" {
		a.cfg.Home = "/root"
	}
	a.execs = newExecTable(a)
	a.sys, a.sysInfo, a.host = cfg.System, cfg.SystemInfo, cfg.Hostname
	if a.sys == nil && a.sysInfo.Error == "" {
		a.sysInfo.Error = "no system disk: the root is the initramfs"
	}
	a.ws = guest.Workspace{Error: cfg.WorkspaceError}
	if cfg.Workspace != "" {
		if err := a.setWorkspace(cfg.Workspace, cfg.Device, cfg.UUID); err != nil {
			return nil, err
		}
	} else if a.ws.Error == "" {
		a.ws.Error = "no workspace volume attached"
	}
	return a, nil
}

func (a *Agent) setWorkspace(dir, device, uuid string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open workspace %s: %w", dir, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root != nil {
		a.root.Close()
	}
	a.root, a.wsDir = root, dir
	a.ws = guest.Workspace{Mounted: true, Device: device, UUID: uuid}
	return nil
}

// workspace returns the open root, or ErrNoWorkspace with the reason.
func (a *Agent) workspace() (*os.Root, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.root == nil {
		return nil, fmt.Errorf("%w: %s; nothing runs until /workspace is the session's volume", guest.ErrNoWorkspace, a.ws.Error)
	}
	return a.root, nil
}

// Reap runs PID 1's zombie collector until ctx ends.
func (a *Agent) Reap(ctx context.Context, sigchld <-chan os.Signal) {
	a.execs.reap(sigchld, ctx.Done())
}

// ServeConn serves one host connection (a vsock connection, or a test
// pipe): handshake, then calls until the connection ends.
func (a *Agent) ServeConn(ctx context.Context, conn net.Conn) error {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	r, err := guest.GuestHandshake(conn, br)
	if err != nil {
		return err
	}
	return a.serveSession(ctx, &readConn{Conn: conn, r: r})
}

// ServePort serves a virtio-serial port for the agent's lifetime. The port
// stays open across host connections (closing it would drop queued data
// and let another opener in); while no host is connected reads return EOF.
func (a *Agent) ServePort(ctx context.Context, port *os.File) error {
	for ctx.Err() == nil {
		port.SetDeadline(time.Time{})
		br := bufio.NewReaderSize(port, 64<<10)
		r, err := guest.GuestHandshake(port, br)
		if err != nil {
			// EOF: no host connected. Polling is the portable wait here:
			// the port reports POLLHUP continuously while disconnected.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		a.log.Info("host connected", "channel", "virtio-serial")
		err = a.serveSession(ctx, &portConn{f: port, r: r})
		a.log.Info("host disconnected", "err", err)
	}
	return ctx.Err()
}

// serveSession runs yamux over rw and one goroutine per stream. It returns
// when the host goes away. Executions keep running.
func (a *Agent) serveSession(ctx context.Context, rw io.ReadWriteCloser) error {
	sess, err := yamux.Server(rw, guest.YamuxConfig())
	if err != nil {
		return err
	}
	a.sessMu.Lock()
	if a.current != nil {
		a.current.Close() // a newer host connection wins
	}
	a.current = sess
	a.sessMu.Unlock()
	defer func() {
		a.sessMu.Lock()
		if a.current == sess {
			a.current = nil
		}
		a.sessMu.Unlock()
		sess.Close()
	}()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer st.Close()
			a.handle(ctx, st)
		})
	}
}

// readConn reads through the handshake's buffer.
type readConn struct {
	net.Conn
	r io.Reader
}

func (c *readConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// portConn adapts the virtio-serial port for one yamux session. Close must
// not close the port: it only unblocks pending reads and writes.
type portConn struct {
	f *os.File
	r io.Reader
}

func (c *portConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *portConn) Write(p []byte) (int, error) { return c.f.Write(p) }
func (c *portConn) Close() error                { return c.f.SetDeadline(time.Now()) }

// stream is one call: a frame reader and a serialised frame writer.
type stream struct {
	fr  *guest.FrameReader
	wmu sync.Mutex
	w   io.Writer
}

func (s *stream) send(t guest.FrameType, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return guest.WriteFrame(s.w, t, p)
}

// sendBuf sends a frame whose payload follows a reserved header in buf.
func (s *stream) sendBuf(t guest.FrameType, buf []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return guest.WriteFrameBuf(s.w, t, buf)
}

func (s *stream) sendJSON(t guest.FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.send(t, b)
}

func (s *stream) fail(op, p string, err error) error {
	return s.sendJSON(guest.FrameError, guest.ErrorFrom(op, p, err))
}

func (a *Agent) handle(ctx context.Context, rw io.ReadWriter) {
	s := &stream{fr: guest.NewFrameReader(rw), w: rw}
	t, p, err := s.fr.Next()
	if err != nil {
		return
	}
	var req guest.Request
	if t != guest.FrameRequest || json.Unmarshal(p, &req) != nil {
		s.sendJSON(guest.FrameError, &guest.Error{Code: guest.CodeBadRequest, Message: "first frame must be a request"})
		return
	}
	result, err := a.dispatch(ctx, s, &req)
	if err != nil {
		s.fail(req.Op, req.Path, err)
		return
	}
	if result != nil {
		s.sendJSON(guest.FrameResult, result)
	}
}

// errStreamed marks calls that already wrote their reply.
var errStreamed = errors.New("reply streamed")

func (a *Agent) dispatch(ctx context.Context, s *stream, req *guest.Request) (any, error) {
	switch req.Op {
	case guest.OpHello:
		a.mu.Lock()
		h := guest.Hello{Version: guest.Version, Agent: a.cfg.Build, Workspace: a.ws, System: a.sysInfo, Hostname: a.host, Booted: a.booted}
		a.mu.Unlock()
		return h, nil
	case guest.OpExec:
		return nil, a.serveExec(ctx, s, req)
	case guest.OpAttach:
		return nil, a.serveAttach(ctx, s, req)
	case guest.OpSignal:
		e, err := a.execs.get(req.ID)
		if err != nil {
			return nil, err
		}
		return struct{}{}, e.signal(syscall.Signal(req.Signal))
	case guest.OpExecs:
		return a.execs.list(), nil
	case guest.OpForget:
		return struct{}{}, a.execs.forget(req.ID)
	case guest.OpStat:
		return a.stat(req.Path)
	case guest.OpList:
		return nil, a.list(s, req.Path)
	case guest.OpRead:
		return nil, a.read(s, req.Path)
	case guest.OpWrite, guest.OpOpen, guest.OpSymlink, guest.OpUnpack, guest.OpMkdir:
		// The calls that create files: what they make is the request's
		// user's. An open that creates nothing needs no owner.
		var owner *tree.Owner
		if req.Op != guest.OpOpen || req.Flags&guest.OpenCreate != 0 {
			var err error
			if owner, err = a.fileOwner(req.Op, req.User); err != nil {
				return nil, err
			}
		}
		switch req.Op {
		case guest.OpWrite:
			return a.write(s, req.Path, req.Mode, owner)
		case guest.OpOpen:
			return nil, a.serveOpen(s, req, owner)
		case guest.OpSymlink:
			return struct{}{}, a.symlink(req.Target, req.Path, owner)
		case guest.OpUnpack:
			return a.unpack(s, req.Path, owner)
		default:
			return struct{}{}, a.mkdir(req.Path, req.All, owner)
		}
	case guest.OpSetstat:
		if req.Attrs == nil {
			return nil, &guest.Error{Code: guest.CodeBadRequest, Op: req.Op, Message: "setstat without attributes"}
		}
		at := *req.Attrs
		if at.Owner != "" {
			if at.UID != nil || at.GID != nil {
				return nil, &guest.Error{Code: guest.CodeBadRequest, Op: req.Op, Message: "setstat with an owner and a uid or gid"}
			}
			u, err := a.lookupUser(req.Op, at.Owner)
			if err != nil {
				return nil, err
			}
			at.UID, at.GID = &u.UID, &u.GID
		}
		return struct{}{}, a.setstat(req.Path, &at)
	case guest.OpStatFollow:
		return a.statFollow(req.Path)
	case guest.OpLink:
		return struct{}{}, a.link(req.Path, req.To)
	case guest.OpStatfs:
		return a.statfs(req.Path)
	case guest.OpRmdir:
		return struct{}{}, a.rmdir(req.Path)
	case guest.OpPack:
		return nil, a.pack(s, req.Path)
	case guest.OpRemove:
		return struct{}{}, a.remove(req.Path, req.All)
	case guest.OpRename:
		return struct{}{}, a.rename(req.Path, req.To)
	case guest.OpFlush:
		return a.flush()
	case guest.OpStats:
		return a.stats()
	case guest.OpShutdown:
		return a.shutdown(ctx, s, req.Wait)
	case guest.OpMount:
		if err := a.setTime(req.Time, req.Data); err != nil {
			return nil, err
		}
		spec := guest.MountSpec{Workspace: req.ID}
		if req.Mount != nil {
			spec = *req.Mount
		}
		return a.mount(spec)
	case guest.OpFreeze:
		return a.freeze()
	case guest.OpFork:
		return a.fork(req)
	case guest.OpDial:
		return nil, a.dial(ctx, s, s.w, req.Port)
	case guest.OpPorts:
		return listenPorts()
	case guest.OpScan:
		return nil, a.scan(s, req)
	case guest.OpTrack:
		return struct{}{}, a.track(req.ID, req.Limit)
	case guest.OpUntrack:
		a.untrack(req.ID)
		return struct{}{}, nil
	case guest.OpChanges:
		return nil, a.changes(s, req.ID)
	case guest.OpThaw:
		if err := a.setTime(req.Time, req.Data); err != nil {
			return nil, err
		}
		return struct{}{}, a.thaw()
	}
	return nil, &guest.Error{Code: guest.CodeBadRequest, Op: req.Op, Message: "unknown operation; host and agent versions differ?"}
}

// env builds a command's environment; u is the user it runs as (nil:
// root, with the agent's HOME).
func (a *Agent) env(req *guest.ExecRequest, u *users.User) []string {
	env := map[string]string{
		"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
		"HOME": a.cfg.Home,
		"USER": "root",
		"LANG": "C.UTF-8",
	}
	if u != nil && u.UID != 0 {
		env["HOME"], env["USER"] = u.Home, u.Name
		if u.Name == "" {
			env["USER"] = strconv.Itoa(u.UID)
		}
		env["LOGNAME"] = env["USER"]
	}
	if req.TTY {
		env["TERM"] = "xterm-256color"
	}
	a.proxyEnv(env)
	for k, v := range req.Env {
		if k != "" && !strings.ContainsAny(k, "=\x00") {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// cwd maps a requested working directory: relative paths are under the
// workspace, "" is the workspace itself.
func (a *Agent) cwd(dir string) string {
	a.mu.Lock()
	ws := a.wsDir
	a.mu.Unlock()
	switch {
	case dir == "" || dir == "/workspace":
		return ws
	case strings.HasPrefix(dir, "/workspace/"):
		return path.Join(ws, strings.TrimPrefix(dir, "/workspace/"))
	case path.IsAbs(dir):
		return dir
	}
	return path.Join(ws, dir)
}
