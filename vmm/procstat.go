package vmm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcStat is what the host's /proc says about a VMM process: its CPU
// time, its resident memory and the storage I/O it caused. Counters count
// from the process's start.
type ProcStat struct {
	// StartTime is field 22 of /proc/PID/stat: with the pid it names one
	// process, so a sampler can tell a reused pid from its VMM.
	StartTime string
	CPU       time.Duration // user + system time
	RSSBytes  int64         // VmRSS
	// ReadBytes and WriteBytes are the bytes the process made the host's
	// storage read and write (read_bytes, write_bytes of /proc/PID/io);
	// zero where the kernel does not account I/O.
	ReadBytes  int64
	WriteBytes int64
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture berth runs on.
const clockTick = 100

// maxProcFile bounds what is read of one /proc file.
const maxProcFile = 16 << 10

// ReadProcStat samples process pid from /proc. A pid that is gone yields
// ErrNotRunning.
func ReadProcStat(pid int) (ProcStat, error) {
	return readProcStat("/proc", pid)
}

func readProcStat(root string, pid int) (ProcStat, error) {
	var ps ProcStat
	if pid <= 0 {
		return ps, fmt.Errorf("pid %d: %w", pid, ErrNotRunning)
	}
	dir := fmt.Sprintf("%s/%d/", root, pid)
	b, err := readSmall(dir + "stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, errNoSuchProcess) {
			return ps, fmt.Errorf("pid %d: %w", pid, ErrNotRunning)
		}
		return ps, err
	}
	// The command name (field 2) may hold spaces and parentheses: count
	// fields from its closing parenthesis. Field 3 is then f[0].
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ps, fmt.Errorf("pid %d: unreadable /proc stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ps, fmt.Errorf("pid %d: short /proc stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return ps, fmt.Errorf("pid %d is a zombie: %w", pid, ErrNotRunning)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseUint(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return ps, fmt.Errorf("pid %d: bad CPU times in /proc stat", pid)
	}
	ps.StartTime = f[19]
	ps.CPU = time.Duration(utime+stime) * time.Second / clockTick
	if b, err := readSmall(dir + "status"); err == nil {
		if kb, ok := procField(b, "VmRSS:"); ok {
			ps.RSSBytes = kb << 10
		}
	}
	// /proc/PID/io needs the same user (or ptrace rights) and a kernel
	// with task I/O accounting; without them the I/O counters stay zero.
	if b, err := readSmall(dir + "io"); err == nil {
		ps.ReadBytes, _ = procField(b, "read_bytes:")
		ps.WriteBytes, _ = procField(b, "write_bytes:")
	}
	return ps, nil
}

var errNoSuchProcess = errors.New("no such process")

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, maxProcFile)
	n, err := f.Read(b)
	if n == 0 && err != nil {
		// A process that exited between open and read (ESRCH).
		return nil, fmt.Errorf("%s: %w: %v", path, errNoSuchProcess, err)
	}
	return b[:n], nil
}

// procField returns the first number after key at the start of a line
// ("VmRSS:\t  2064 kB" gives 2064).
func procField(b []byte, key string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		f := strings.Fields(line[len(key):])
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}
