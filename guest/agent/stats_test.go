package agent

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

func TestParseCPUTicks(t *testing.T) {
	for _, tc := range []struct {
		name, in    string
		busy, total uint64
		cpus        int
	}{
		{"two cpus", "cpu  10 1 5 100 4 1 1 2 7 0\ncpu0 5 0 2 50 2 0 1 1 0 0\ncpu1 5 1 3 50 2 1 0 1 0 0\nintr 1 2\n", 20, 124, 2},
		{"old kernel, 4 fields", "cpu 3 0 1 10\ncpu0 3 0 1 10\n", 4, 14, 1},
		{"empty", "", 0, 0, 0},
		{"garbage", "hello\nworld\n", 0, 0, 0},
	} {
		busy, total, cpus := parseCPUTicks([]byte(tc.in))
		if busy != tc.busy || total != tc.total || cpus != tc.cpus {
			t.Errorf("%s: busy %d total %d cpus %d, want %d %d %d", tc.name, busy, total, cpus, tc.busy, tc.total, tc.cpus)
		}
	}
}

func TestDiskIO(t *testing.T) {
	stats := []byte(" 254       0 vda 100 0 2048 10 50 0 4096 20 0 30 30\n 254      16 vdb 1 0 8 1 2 0 16 1 0 2 2 0 0 0 0\n   7       0 loop0 bad\n")
	for _, tc := range []struct {
		dev  uint64
		want guest.DiskIO
	}{
		{unix.Mkdev(254, 0), guest.DiskIO{ReadBytes: 2048 * 512, WriteBytes: 4096 * 512}},
		{unix.Mkdev(254, 16), guest.DiskIO{ReadBytes: 8 * 512, WriteBytes: 16 * 512}},
		{unix.Mkdev(7, 0), guest.DiskIO{}},
		{unix.Mkdev(8, 0), guest.DiskIO{}},
		{0, guest.DiskIO{}},
	} {
		if got := diskIO(stats, tc.dev); got != tc.want {
			t.Errorf("dev %d:%d = %+v, want %+v", unix.Major(tc.dev), unix.Minor(tc.dev), got, tc.want)
		}
	}
}
