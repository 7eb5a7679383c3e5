package app

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// An export's output: refused before a byte is written when the tarball
// does not fit, with the figures; written under a temporary name and
// renamed only when whole; nothing left at the path when it fails.
func TestExportFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.tar")
	x := session.ImageExport{Name: "app", Size: 5 << 20}

	f, err := newExportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.free = func(*os.File) (int64, error) { return 1 << 20, nil }
	_, err = f.open(x)
	if err == nil || !strings.Contains(err.Error(), "is 5.0 MiB and "+dir+" has 1.0 MiB free: nothing was written") {
		t.Errorf("a tarball bigger than the free space: %v", err)
	}
	f.discard()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused export left %v", ents)
	}

	f, err = newExportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := f.open(x)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(w, "half")
	if _, err := os.Stat(path); err == nil {
		t.Error("the tarball has its name before it is whole")
	}
	if err := f.commit(); err != nil {
		t.Fatal(err)
	}
	f.discard()
	if b, err := os.ReadFile(path); err != nil || string(b) != "half" {
		t.Errorf("committed file: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory holds %v, want only the tarball", ents)
	}
}
