package image

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// parseNewc reads a newc archive back: names, modes and contents.
func parseNewc(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for off := 0; ; {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		field := func(i int) int {
			v, _ := strconv.ParseUint(string(b[off+6+i*8:off+14+i*8]), 16, 32)
			return int(v)
		}
		size, namesize := field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off += 110 + namesize
		off = (off + 3) &^ 3
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = b[off : off+size]
		off = (off + size + 3) &^ 3
	}
}

func TestCpio(t *testing.T) {
	var b bytes.Buffer
	w := &cpioWriter{w: &b}
	w.Dir("bin", 0o755)
	w.File("init", 0o755, []byte("#!/bin/sh\n"))
	w.Symlink("bin/sh", "busybox")
	w.File("odd", 0o644, []byte("12345"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := parseNewc(t, b.Bytes())
	if string(got["init"]) != "#!/bin/sh\n" || string(got["bin/sh"]) != "busybox" || string(got["odd"]) != "12345" {
		t.Fatalf("archive = %q", got)
	}
	if b.Len()%4 != 0 {
		t.Errorf("archive length %d is not 4-aligned", b.Len())
	}
}

func TestResolveModules(t *testing.T) {
	dir := t.TempDir()
	for _, m := range []string{"kernel/fs/ext4/ext4.ko", "kernel/fs/jbd2/jbd2.ko", "kernel/lib/crc16.ko", "kernel/fs/mbcache.ko", "kernel/drivers/virtio/virtio.ko", "kernel/drivers/block/virtio_blk.ko", "kernel/crypto/crc32c_generic.ko"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(m)), 0o755)
		os.WriteFile(filepath.Join(dir, m), nil, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(strings.Join([]string{
		"kernel/fs/ext4/ext4.ko: kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko kernel/lib/crc16.ko",
		"kernel/fs/jbd2/jbd2.ko:",
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko",
	}, "\n")), 0o644)
	ix, err := loadModuleIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	order, err := ix.resolve([]string{"virtio-blk", "crc32c_generic", "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range order {
		pos[filepath.Base(m)] = i
	}
	for _, dep := range [][2]string{{"virtio.ko", "virtio_blk.ko"}, {"jbd2.ko", "ext4.ko"}, {"mbcache.ko", "ext4.ko"}, {"crc16.ko", "ext4.ko"}} {
		if pos[dep[0]] >= pos[dep[1]] {
			t.Errorf("%s loads after %s: %v", dep[0], dep[1], order)
		}
	}
	if len(order) != 7 {
		t.Errorf("order %v", order)
	}
	if _, err := ix.resolve([]string{"nonexistent"}); err == nil || !strings.Contains(err.Error(), "not in the kernel package") {
		t.Errorf("missing module: %v", err)
	}
}
