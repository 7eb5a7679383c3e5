package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm"
)

// Files the driver keeps in Config.Dir. Attach finds a VM again through
// them, so the names are part of the on-disk format.
const (
	// PidFile holds the VMM's process id in decimal.
	PidFile = "vmm.pid"
	// APISocket is CH's REST API socket (--api-socket).
	APISocket = "ch-api.sock"
	// VsockSocket is the host side of the VM's hybrid vsock device.
	VsockSocket = "vsock.sock"
	// LogFile receives CH's stdout and stderr.
	LogFile = "vmm.log"
	// ConsoleLog receives the guest's serial console (ttyS0).
	ConsoleLog = "console.log"
)

// Bounds on log handling.
const (
	logTailLines = 20
	// A log past this size is moved to LogFile+".1" at the next start, so
	// a session restarted for months keeps one previous run and no more.
	maxLogSize = 1 << 20
)

// sunPathMax is the longest unix socket path Linux accepts (sun_path is
// 108 bytes including the terminating NUL).
const sunPathMax = 107

// paths are the files of one VM directory.
type paths struct {
	dir, pid, api, vsock, log, console string
}

func pathsIn(dir string) paths {
	return paths{
		dir:     dir,
		pid:     filepath.Join(dir, PidFile),
		api:     filepath.Join(dir, APISocket),
		vsock:   filepath.Join(dir, VsockSocket),
		log:     filepath.Join(dir, LogFile),
		console: filepath.Join(dir, ConsoleLog),
	}
}

// checkSocketPaths fails early and clearly where CH would fail to bind.
func (p paths) checkSocketPaths() error {
	if strings.Contains(p.dir, ",") {
		// CH splits its --api-socket option on commas.
		return fmt.Errorf("VM directory %s contains a comma, which cloud-hypervisor's option parser cannot take: rename it", p.dir)
	}
	for _, s := range []string{p.api, p.vsock} {
		if len(s) > sunPathMax {
			return fmt.Errorf("socket path %s is %d bytes, over the unix socket limit of %d: use a shorter data directory", s, len(s), sunPathMax)
		}
	}
	return nil
}

// process is a VMM process berth watches: either its own child, or one an
// earlier berth started, watched through a pidfd.
type process struct {
	pid     int
	child   bool
	logPath string

	done chan struct{} // closed once the process has exited
	exit vmm.Exit      // set before done is closed

	// signal sends sig; a process that has already exited is not an error.
	signal func(sig syscall.Signal) error
	// release stops watching (attached processes only); done then never
	// closes. Nil for children, whose watcher ends with the child.
	release func()
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startProcess launches the VMM detached: its own process group, so a
// terminal's ^C or the daemon's exit does not reach it, stdio on the log
// file, and no context, because the VMM outlives the request that
// started it.
func startProcess(binary string, args []string, p paths, netns bool) (*process, error) {
	if err := rotateLog(p.log); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open VMM log: %w", err)
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "berth: %s starting %s %s\n", time.Now().Format(time.RFC3339), binary, strings.Join(args, " "))

	cmd := exec.Command(binary, args...)
	cmd.Dir = p.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if netns {
		// A network namespace of its own, for its NIC's tap (nic.go).
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	if err := cmd.Start(); err != nil {
		if netns && errors.Is(err, syscall.EPERM) {
			return nil, fmt.Errorf("start %s in a network namespace of its own, for the guest NIC: %w (berth needs root or CAP_SYS_ADMIN for it; net_nic = false in config.toml boots without one)", binary, err)
		}
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	proc := &process{
		pid:     cmd.Process.Pid,
		child:   true,
		logPath: p.log,
		done:    make(chan struct{}),
		signal: func(sig syscall.Signal) error {
			if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
				return err
			}
			return nil
		},
	}
	// Ends when the child exits; it reaps the child, so it runs even after
	// the VM handle is closed.
	go func() {
		_ = cmd.Wait()
		proc.exit = childExit(cmd.ProcessState)
		proc.exit.LogTail = vmm.LogTail(p.log, logTailLines)
		close(proc.done)
	}()
	return proc, nil
}

func childExit(ps *os.ProcessState) vmm.Exit {
	e := vmm.Exit{Code: -1, Time: time.Now()}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		e.Signal = unix.SignalName(ws.Signal())
		if e.Signal == "" {
			e.Signal = ws.Signal().String()
		}
	default:
		e.Code = ps.ExitCode()
	}
	return e
}

// watchProcess follows a VMM that is not berth's child. Only a child's
// exit status can be collected, so Exit.Code stays -1; the pidfd still
// says when the process ends, and signals through it cannot hit a
// recycled pid.
func watchProcess(pid int, logPath string) (*process, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("process %d has exited: %w", pid, vmm.ErrNotRunning)
		}
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	// A non-blocking pidfd joins the runtime poller, so waiting for the
	// exit costs no thread.
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("pidfd for %d: %w", pid, err)
	}
	proc := &process{
		pid:     pid,
		logPath: logPath,
		done:    make(chan struct{}),
	}
	proc.signal = func(sig syscall.Signal) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.PidfdSendSignal(int(fd), sig, nil, 0)
		}); err != nil {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
		if serr != nil && !errors.Is(serr, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", pid, serr)
		}
		return nil
	}
	var once sync.Once
	proc.release = func() { once.Do(func() { f.Close() }) }
	// Ends when the process exits, or when release closes the pidfd.
	go func() {
		err := rc.Read(func(fd uintptr) bool {
			// A pidfd turns readable when its process has exited.
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 0)
			return err == nil && n > 0
		})
		if err != nil {
			return // released
		}
		proc.exit = vmm.Exit{Code: -1, Time: time.Now(), LogTail: vmm.LogTail(logPath, logTailLines)}
		close(proc.done)
		proc.release()
	}()
	return proc, nil
}

// rotateLog moves an oversized log aside (replacing the previous one).
func rotateLog(path string) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() <= maxLogSize {
		return nil
	}
	if err := os.Rename(path, path+".1"); err != nil {
		return fmt.Errorf("rotate VMM log: %w", err)
	}
	return nil
}

// removeStaleSocket deletes a socket file left by a VMM that died without
// cleaning up: CH binds its vsock socket without unlinking first and then
// fails with EADDRINUSE. Call it only once no live VMM owns the directory.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket: move it away", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}

// locked reports whether any process holds an OFD or POSIX lock on path.
// CH locks disk images (and, since v53.0, <api socket>.lock) with OFD
// locks, by default over the bytes the image has; QEMU locks some bytes
// of its images. A write lock probe over the whole file conflicts with
// any of them.
func locked(path string) (bool, error) { return lockConflicts(path, unix.F_WRLCK) }

// writeLocked reports whether any process holds a write lock on path,
// as a VMM writing the image does; the shared read locks of VMMs holding
// it read-only do not count.
func writeLocked(path string) (bool, error) { return lockConflicts(path, unix.F_RDLCK) }

// lockConflicts reports whether a lock of type typ over the whole of
// path would conflict with one another open file holds.
func lockConflicts(path string, typ int16) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	lk := unix.Flock_t{Type: typ, Whence: io.SeekStart}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, fmt.Errorf("probe lock on %s: %w", path, err)
	}
	return lk.Type != unix.F_UNLCK, nil
}

// liveVMM reports the pid of a VMM still serving dir, so Start never
// deletes the sockets of a live VM. A VMM is live when vmm.pid names a
// running process and either its API answers or its socket lock is held.
func liveVMM(ctx context.Context, p paths) (int, bool) {
	pid, err := vmm.ReadPidFile(p.pid)
	if err != nil || unix.Kill(pid, 0) == unix.ESRCH {
		return 0, false
	}
	if held, err := locked(p.api + ".lock"); err == nil && held {
		return pid, true
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ping, err := newAPIClient(p.api).ping(ctx)
	if err != nil {
		return 0, false
	}
	if ping.Pid != nil && int(*ping.Pid) != pid {
		// Someone else's CH answers here; still not ours to remove.
		return int(*ping.Pid), true
	}
	return pid, true
}
