package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

var (
	errNotDir = syscall.ENOTDIR
	errIsDir  = syscall.EISDIR
	errBusy   = syscall.EBUSY
)

// meminfo reads the named fields of /proc/meminfo, in bytes.
func meminfo(fields ...string) map[string]int64 {
	out := make(map[string]int64, len(fields))
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, want := range fields {
			if name == want {
				v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				out[name] = v << 10
			}
		}
	}
	return out
}

// dirty is the page cache not yet on the disk. The workspace and the
// system disk are the only block-backed writable filesystems in the guest,
// so the system-wide figures are theirs together.
func dirty() int64 {
	m := meminfo("Dirty", "Writeback")
	return m["Dirty"] + m["Writeback"]
}

// flush makes every pending workspace write durable: syncfs writes back
// the filesystem and issues a cache flush, which QEMU turns into fdatasync
// of the image. It reports writeback errors too (Linux ≥ 5.8).
func (a *Agent) flush() (guest.FlushResult, error) {
	root, err := a.workspace()
	if err != nil {
		return guest.FlushResult{}, err
	}
	start := time.Now()
	before := dirty()
	d, err := root.Open(".")
	if err != nil {
		return guest.FlushResult{}, err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return guest.FlushResult{}, fmt.Errorf("syncfs /workspace: %w", err)
	}
	if sys := a.system(); sys != nil {
		if err := unix.Syncfs(int(sys.Fd())); err != nil {
			return guest.FlushResult{}, fmt.Errorf("syncfs the system disk: %w", err)
		}
	}
	return guest.FlushResult{DirtyBefore: before, DirtyAfter: dirty(), Took: time.Since(start)}, nil
}

func (a *Agent) stats() (guest.Stats, error) {
	m := meminfo("MemTotal", "MemAvailable", "Dirty", "Writeback")
	st := guest.Stats{
		MemTotal: m["MemTotal"], MemAvailable: m["MemAvailable"],
		Dirty: m["Dirty"], Writeback: m["Writeback"],
		Uptime: time.Since(a.booted),
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		for i := 0; i < 3 && i < len(f); i++ {
			st.Load[i], _ = strconv.ParseFloat(f[i], 64)
		}
	}
	if a.cfg.PID1 {
		if b, err := os.ReadFile("/proc/uptime"); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				secs, _ := strconv.ParseFloat(f[0], 64)
				st.Uptime = time.Duration(secs * float64(time.Second))
			}
		}
	}
	a.mu.Lock()
	dir := a.wsDir
	a.mu.Unlock()
	if dir != "" {
		var fs unix.Statfs_t
		if unix.Statfs(dir, &fs) == nil {
			st.WorkspaceSize = int64(fs.Blocks) * fs.Bsize
			st.WorkspaceUsed = int64(fs.Blocks-fs.Bfree) * fs.Bsize
		}
	}
	if sys := a.system(); sys != nil {
		var fs unix.Statfs_t
		if unix.Fstatfs(int(sys.Fd()), &fs) == nil {
			st.SystemSize = int64(fs.Blocks) * fs.Bsize
			st.SystemUsed = int64(fs.Blocks-fs.Bfree) * fs.Bsize
		}
	}
	st.Running = len(a.execs.running())
	st.CPUBusyTicks, st.CPUTotalTicks, st.CPUs = cpuTicks()
	var wsDev, sysDev uint64
	if dir != "" {
		var sb unix.Stat_t
		if unix.Stat(dir, &sb) == nil {
			wsDev = sb.Dev
		}
	}
	if sys := a.system(); sys != nil {
		var sb unix.Stat_t
		if unix.Fstat(int(sys.Fd()), &sb) == nil {
			sysDev = sb.Dev
		}
	}
	if wsDev != 0 || sysDev != 0 {
		if b, err := os.ReadFile("/proc/diskstats"); err == nil {
			st.WorkspaceIO, st.SystemIO = diskIO(b, wsDev), diskIO(b, sysDev)
		}
	}
	return st, nil
}

// cpuTicks reads the first line of /proc/stat ("cpu user nice system idle
// iowait irq softirq steal ..."): busy is all but idle and iowait.
func cpuTicks() (busy, total uint64, cpus int) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	return parseCPUTicks(b)
}

func parseCPUTicks(b []byte) (busy, total uint64, cpus int) {
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			if i > 0 {
				break
			}
			continue
		}
		if f[0] != "cpu" {
			cpus++
			continue
		}
		// guest and guest_nice (fields 9, 10) are already in user and nice.
		for j := 1; j < len(f) && j <= 8; j++ {
			v, _ := strconv.ParseUint(f[j], 10, 64)
			total += v
			if j != 4 && j != 5 { // idle, iowait
				busy += v
			}
		}
	}
	return busy, total, cpus
}

// diskIO finds device dev in /proc/diskstats ("major minor name reads
// merged sectors ms writes merged sectors ms ..."); sectors are 512 bytes.
func diskIO(b []byte, dev uint64) guest.DiskIO {
	if dev == 0 {
		return guest.DiskIO{}
	}
	maj, mnr := strconv.FormatUint(uint64(unix.Major(dev)), 10), strconv.FormatUint(uint64(unix.Minor(dev)), 10)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[0] != maj || f[1] != mnr {
			continue
		}
		r, _ := strconv.ParseInt(f[5], 10, 64)
		w, _ := strconv.ParseInt(f[9], 10, 64)
		return guest.DiskIO{ReadBytes: r * 512, WriteBytes: w * 512}
	}
	return guest.DiskIO{}
}

// shutdown stops every running command (TERM, then KILL after grace),
// flushes and unmounts the workspace, replies, and powers off.
func (a *Agent) shutdown(ctx context.Context, s *stream, grace time.Duration) (any, error) {
	if grace <= 0 {
		grace = 5 * time.Second
	}
	a.mu.Lock()
	a.closing = true
	a.mu.Unlock()
	running := a.execs.running()
	for _, e := range running {
		e.signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for _, e := range running {
		for time.Now().Before(deadline) {
			e.mu.Lock()
			done := e.done
			e.mu.Unlock()
			if done {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.signal(syscall.SIGKILL)
	}
	if a.cfg.PID1 {
		// Processes that outlived their commands (a server a command
		// started in the background, a shell's job) are writers too, and
		// their working directories keep the workspace busy, so the
		// unmount failed and the host killed the VM: end them the same
		// way before the flush. Power-off would end them anyway, without
		// a chance to finish their writes.
		endStragglers(deadline)
	}
	// Files the host holds open would keep the workspace busy; a staged
	// file never closed is dropped, as when its host goes away.
	a.releaseHandles(fmt.Errorf("%w: unmounted for shutdown", guest.ErrNoWorkspace))
	var res guest.FlushResult
	if _, err := a.workspace(); err == nil {
		var err error
		if res, err = a.flush(); err != nil {
			return nil, err
		}
		a.mu.Lock()
		a.root.Close()
		a.root = nil
		a.ws = guest.Workspace{Error: "unmounted for shutdown"}
		dir := a.wsDir
		a.mu.Unlock()
		if a.cfg.PID1 {
			if err := unix.Unmount(dir, 0); err != nil {
				return nil, fmt.Errorf("unmount /workspace: %w (a process still holds it)", err)
			}
		}
	}
	unix.Sync()
	s.sendJSON(guest.FrameResult, res)
	if a.cfg.PowerOff != nil {
		time.Sleep(50 * time.Millisecond) // let the reply leave the channel
		a.cfg.PowerOff()
	}
	return nil, nil
}

// endStragglers sends TERM to every process but PID 1 (the agent), waits
// until deadline for them to exit (the reaper collects them), then KILLs
// what is left and waits a moment for the kernel to let go of it.
func endStragglers(deadline time.Time) {
	if len(userProcs()) == 0 {
		return
	}
	unix.Kill(-1, unix.SIGTERM)
	for time.Now().Before(deadline) && len(userProcs()) > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	unix.Kill(-1, unix.SIGKILL)
	for end := time.Now().Add(time.Second); time.Now().Before(end) && len(userProcs()) > 0; {
		time.Sleep(20 * time.Millisecond)
	}
}

// userProcs lists the live processes other than PID 1: not kernel
// threads (kthreadd, pid 2, and its children) and not zombies.
func userProcs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 2 {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" || f[1] == "2" {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// setTime sets the clock after a snapshot restore and mixes host entropy
// into the guest's RNG, so restored VMs neither live in the past nor share
// random state.
func (a *Agent) setTime(ns int64, seed []byte) error {
	if !a.cfg.PID1 {
		return nil
	}
	if ns > 0 {
		tv := unix.NsecToTimeval(ns)
		if err := unix.Settimeofday(&tv); err != nil {
			return fmt.Errorf("set clock: %w", err)
		}
	}
	if len(seed) > 0 {
		if f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0); err == nil {
			f.Write(seed)
			f.Close()
		}
	}
	return nil
}

func (a *Agent) mount(spec guest.MountSpec) (guest.Workspace, error) {
	if a.cfg.Mount == nil {
		return guest.Workspace{}, &guest.Error{Code: "EPERM", Op: "mount", Message: "this agent does not mount volumes after boot"}
	}
	m, err := a.cfg.Mount(spec)
	if m.System != nil {
		a.mu.Lock()
		a.sys = m.System
		a.sysInfo = guest.Workspace{Mounted: true, Device: m.SystemDevice, UUID: spec.System}
		a.mu.Unlock()
	}
	if spec.Hostname != "" {
		a.mu.Lock()
		a.host = spec.Hostname
		a.mu.Unlock()
	}
	if err != nil {
		return guest.Workspace{}, err
	}
	if err := a.setWorkspace(m.Workspace, m.Device, spec.Workspace); err != nil {
		return guest.Workspace{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ws, nil
}

// system returns the system disk's root directory, or nil.
func (a *Agent) system() *os.File {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sys
}

// cgroupRoot is where per-execution cgroups live in the guest.
const cgroupRoot = "/sys/fs/cgroup/berth"

// newCgroup creates a cgroup for one execution and returns its directory,
// or nil when cgroups are not in use (host tests, or no cgroup2 mounted).
func (a *Agent) newCgroup(id string) *os.File {
	if !a.cfg.PID1 {
		return nil
	}
	dir := filepath.Join(cgroupRoot, id)
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return nil
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	return f
}

// Linux's FIFREEZE and FITHAW ioctls (include/uapi/linux/fs.h).
const (
	fiFreeze = 0xC0045877
	fiThaw   = 0xC0045878
)

// freeze flushes the workspace and freezes it: writers block until thaw,
// and the filesystem on the volume is clean, so a memory snapshot and the
// untouched disk agree, and a cold boot on the disk alone is safe too.
func (a *Agent) freeze() (guest.FlushResult, error) {
	res, err := a.flush()
	if err != nil {
		return res, err
	}
	root, err := a.workspace()
	if err != nil {
		return res, err
	}
	d, err := root.Open(".")
	if err != nil {
		return res, err
	}
	defer d.Close()
	if err := unix.IoctlSetInt(int(d.Fd()), fiFreeze, 0); err != nil && err != unix.EBUSY {
		return res, fmt.Errorf("freeze /workspace: %w", err)
	}
	// The system disk is frozen after the workspace: freezing the root's
	// upper layer stops every writer in the VM, the agent's own workspace
	// call included.
	if sys := a.system(); sys != nil {
		if err := unix.IoctlSetInt(int(sys.Fd()), fiFreeze, 0); err != nil && err != unix.EBUSY {
			unix.IoctlSetInt(int(d.Fd()), fiThaw, 0)
			return res, fmt.Errorf("freeze the system disk: %w", err)
		}
	}
	return res, nil
}

// thaw undoes freeze; thawing a filesystem that is not frozen is fine.
func (a *Agent) thaw() error {
	if sys := a.system(); sys != nil {
		if err := unix.IoctlSetInt(int(sys.Fd()), fiThaw, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("thaw the system disk: %w", err)
		}
	}
	root, err := a.workspace()
	if err != nil {
		return err
	}
	d, err := root.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.IoctlSetInt(int(d.Fd()), fiThaw, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("thaw /workspace: %w", err)
	}
	return nil
}
