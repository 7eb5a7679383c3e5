package vmm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// PidFile is the name of the file in a VM's directory that records the
// VMM's pid and start time, so a later berth can find and verify it.
const PidFile = "vmm.pid"

// Process is a VMM process started detached: its own process group, output
// to a log file, so it outlives berth. Whoever holds a Process learns of
// its exit through Done, whether berth started it or re-attached to it.
type Process struct {
	Pid     int
	LogPath string

	done chan struct{}
	mu   sync.Mutex
	exit Exit
}

// StartProcess launches binary in dir (its working directory, so relative
// socket paths stay short) with output appended to logPath, and records it
// in dir/vmm.pid.
func StartProcess(dir, binary string, args []string, logPath string, extra ...*os.File) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), binary, strings.Join(args, " "))
	// Not CommandContext: the VMM must outlive the request that started it.
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = extra // fd 3 onward
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	p := &Process{Pid: cmd.Process.Pid, LogPath: logPath, done: make(chan struct{})}
	if err := WritePidFile(filepath.Join(dir, PidFile), p.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	go func() {
		err := cmd.Wait()
		e := Exit{Code: -1, Time: time.Now()}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				e.Signal = unix.SignalName(st.Signal())
			} else {
				e.Code = ee.ExitCode()
			}
		} else if err == nil {
			e.Code = 0
		}
		p.finish(e)
	}()
	return p, nil
}

func (p *Process) finish(e Exit) {
	e.LogTail = LogTail(p.LogPath, 20)
	p.mu.Lock()
	p.exit = e
	p.mu.Unlock()
	close(p.done)
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit tells how the process ended; valid after Done.
func (p *Process) Exit() Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// Alive reports whether the process still runs.
func (p *Process) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the process group and waits up to the timeout.
func (p *Process) Kill(timeout time.Duration) error {
	if !p.Alive() {
		return nil
	}
	syscall.Kill(-p.Pid, syscall.SIGKILL)
	syscall.Kill(p.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("VMM pid %d did not exit after SIGKILL", p.Pid)
	}
}

// StartTime is field 22 of /proc/<pid>/stat, the process's start time in
// clock ticks since boot: with the pid, it names one process.
func StartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may hold spaces and parentheses: count
	// fields from its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", errors.New("short /proc stat")
	}
	return f[19], nil
}

// WritePidFile records pid with its start time ("<pid> <starttime>\n"),
// so a later berth can tell the VMM from a process that reused its pid.
func WritePidFile(path string, pid int) error {
	st, err := StartTime(pid)
	if err != nil {
		st = "0"
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+" "+st+"\n"), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// ReadPidFile returns the pid recorded in path. It fails with
// ErrNotRunning if the recorded start time shows the pid now belongs to
// another process; a pid that is gone is returned as it is.
func ReadPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	var pid int
	if len(f) == 1 || len(f) == 2 {
		pid, err = strconv.Atoi(f[0])
	}
	if len(f) == 0 || len(f) > 2 || err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s does not hold a pid: %q", path, bytes.TrimSpace(b))
	}
	if len(f) == 2 && f[1] != "0" {
		if st, err := StartTime(pid); err == nil && st != f[1] {
			return 0, fmt.Errorf("process %d is not the VMM recorded in %s (it started later): %w", pid, path, ErrNotRunning)
		}
	}
	return pid, nil
}

// AttachProcess finds the VMM recorded in dir/vmm.pid. The start time guards
// against a recycled pid. Its exit is watched through a pidfd, since it is
// not berth's child any more; the exit code is then unknown.
func AttachProcess(dir, logPath string) (*Process, error) {
	pid, err := ReadPidFile(filepath.Join(dir, PidFile))
	if errors.Is(err, ErrNotRunning) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotRunning, err)
	}
	if _, err := StartTime(pid); err != nil {
		return nil, fmt.Errorf("%w: VMM pid %d has exited", ErrNotRunning, pid)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: watch VMM pid %d: %v", ErrNotRunning, pid, err)
	}
	p := &Process{Pid: pid, LogPath: logPath, done: make(chan struct{})}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == unix.EINTR {
				continue
			}
			break
		}
		p.finish(Exit{Code: -1, Time: time.Now()})
	}()
	return p, nil
}

// KillStrays kills every process working in dir, a VM's directory, and
// returns their pids. A VMM works in its VM's directory (StartProcess
// makes it its working directory), so this finds one that no vmm.pid
// records: one a daemon was killed in starting (between its fork and the
// pid file), or one a driver could not attach to (QEMU still taking in a
// template's migration). Left alone, such a VMM runs on unsupervised, and
// the session's next start runs a second beside it.
func KillStrays(dir string) []int {
	dir = filepath.Clean(dir)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var killed []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == os.Getpid() {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil {
			continue
		}
		// A directory removed under the process reads "DIR (deleted)".
		if cwd != dir && cwd != dir+" (deleted)" {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, pid)
	}
	return killed
}

// LogTail returns the last n lines of a log file, reading at most its last
// 8 KiB, for crash reports; "" if it cannot be read.
func LogTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	const window = 8 << 10
	off := max(st.Size()-window, 0)
	buf, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return ""
	}
	if off > 0 {
		// Drop the line the window starts in the middle of.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// DialUnix connects to a unix socket, also when its path is longer than
// the 108 bytes sockaddr_un allows (deep data directories): the directory
// is then reached through /proc/self/fd.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < 100 {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

// WaitDial retries DialUnix until it succeeds, the process dies, or ctx ends.
func WaitDial(ctx context.Context, path string, p *Process) (net.Conn, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		c, err := DialUnix(ctx, path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", filepath.Base(path), ctx.Err())
		case <-p.Done():
			return nil, fmt.Errorf("%w: VMM %s before it answered: %s", ErrNotRunning, p.Exit(), lastLine(p.Exit().LogTail))
		case <-t.C:
		}
	}
}

// LastLogLine is the last line of the VMM's log at its exit: most often
// the reason it gave.
func (e Exit) LastLogLine() string { return lastLine(e.LogTail) }

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// HolderPid finds a process other than self that has path open, for
// messages like "in use by VM pid 4121". It returns 0 if none is found.
func HolderPid(path string) int {
	abs, err := filepath.Abs(path)
	if err != nil {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		if target, err := os.Readlink(fd); err == nil && target == abs {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			if pid != os.Getpid() {
				return pid
			}
		}
	}
	return 0
}
