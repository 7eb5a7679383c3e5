package vmm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestReadProcStatFixtures(t *testing.T) {
	stat := func(comm, state string) string {
		// pid (comm) state ppid ... utime=field14 stime=field15 ... starttime=field22
		return "42 (" + comm + ") " + state + " 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 777 1000 200\n"
	}
	for _, tc := range []struct {
		name, stat, status, io string
		want                   ProcStat
		err                    error
	}{
		{name: "full", stat: stat("qemu-system-x86", "S"),
			status: "Name:\tqemu\nVmHWM:\t  9000 kB\nVmRSS:\t  2048 kB\n",
			io:     "rchar: 1\nwchar: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n",
			want:   ProcStat{StartTime: "777", CPU: 3 * time.Second, RSSBytes: 2 << 20, ReadBytes: 4096, WriteBytes: 8192}},
		{name: "spaces and parens in comm", stat: stat("a) (b c", "R"), status: "VmRSS: 1 kB\n",
			want: ProcStat{StartTime: "777", CPU: 3 * time.Second, RSSBytes: 1024}},
		{name: "no io file", stat: stat("qemu", "S"),
			want: ProcStat{StartTime: "777", CPU: 3 * time.Second}},
		{name: "zombie", stat: stat("qemu", "Z"), err: ErrNotRunning},
		{name: "gone", err: ErrNotRunning},
		{name: "garbage", stat: "42 no parens", err: errors.New("unreadable")},
		{name: "short", stat: "42 (x) S 1 2\n", err: errors.New("short")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "42")
			os.MkdirAll(dir, 0o755)
			for name, body := range map[string]string{"stat": tc.stat, "status": tc.status, "io": tc.io} {
				if body != "" {
					os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
				}
			}
			got, err := readProcStat(root, 42)
			switch {
			case tc.err == nil && err != nil:
				t.Fatalf("err = %v", err)
			case tc.err != nil && err == nil:
				t.Fatalf("got %+v, want an error", got)
			case tc.err == ErrNotRunning && !errors.Is(err, ErrNotRunning):
				t.Fatalf("err = %v, want ErrNotRunning", err)
			}
			if tc.err == nil && got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadProcStatSelf(t *testing.T) {
	a, err := ReadProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if a.RSSBytes <= 0 || a.StartTime == "" {
		t.Fatalf("self: %+v", a)
	}
	// Burn CPU until the counter moves (bounded: it must, within 10 s).
	var b ProcStat
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		for x := 0; x < 1e6; x++ {
		}
		if b, err = ReadProcStat(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		if b.CPU > a.CPU {
			break
		}
	}
	if b.CPU <= a.CPU || b.StartTime != a.StartTime {
		t.Fatalf("CPU %v then %v (start %s, %s)", a.CPU, b.CPU, a.StartTime, b.StartTime)
	}
	if _, err := ReadProcStat(0); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("pid 0: %v", err)
	}
}
