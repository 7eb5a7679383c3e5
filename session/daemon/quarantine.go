package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/berthvm/berth/session/engine"
)

// Quarantined is one copy of a session set aside on this host because the
// fleet's owner key said another host (or a later epoch) holds it.
type Quarantined struct {
	Session string    `json:"session"`
	Dir     string    `json:"dir"`
	At      time.Time `json:"at"`
	Why     string    `json:"why"`
	Bytes   int64     `json:"bytes"` // allocated on disk
}

// ListQuarantined lists the copies in dataDir's quarantine, oldest
// first. Nothing removes them: an operator reads them and removes the
// directory when done.
func ListQuarantined(dataDir string) ([]Quarantined, error) {
	root := engine.QuarantineDir(dataDir)
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the quarantine %s: %w", root, err)
	}
	var out []Quarantined
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		// NAME-20060102T150405.000000000Z
		i := strings.LastIndex(e.Name(), "-")
		if i <= 0 {
			continue
		}
		q := Quarantined{Session: e.Name()[:i], Dir: filepath.Join(root, e.Name())}
		q.At, _ = time.Parse("20060102T150405.000000000Z", e.Name()[i+1:])
		if b, err := os.ReadFile(filepath.Join(q.Dir, "why.txt")); err == nil {
			q.Why = strings.TrimSpace(string(b))
		}
		filepath.WalkDir(q.Dir, func(_ string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if fi, err := d.Info(); err == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); ok {
						q.Bytes += st.Blocks * 512 // sparse disks: what they take
					} else {
						q.Bytes += fi.Size()
					}
				}
			}
			return nil
		})
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}
