package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// newManager runs a Manager on real QEMU VMs in a fresh data directory.
func newManager(t *testing.T) *engine.Manager {
	if testing.Short() {
		t.Skip("boots VMs")
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := engine.NewManager(t.Context(), st, engine.Config{
		DataDir:  dir,
		Defaults: engine.Defaults{DiskBytes: 128 << 20, MemoryMiB: 384, Accel: vmm.AccelTCG},
		Drivers:  map[string]vmm.Driver{"qemu": qemu.New(qemu.Options{})},
		Images:   vmmtest.Images(t),
		Logger:   log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Sessions the suite left are deleted; Close leaves VMs running
		// by design, so a test must not leave any.
		list, _ := m.List(context.Background())
		for _, s := range list {
			m.Delete(context.Background(), s.Name)
		}
		m.Close()
		st.Close()
	})
	return m
}

// The same contract the in-memory fake keeps, kept by the real Manager on
// real VMs, in-process and through the daemon's socket API.
func TestManagerConformance(t *testing.T) {
	m := newManager(t)
	t.Run("in-process", func(t *testing.T) { sessiontest.Suite(t, m) })
	t.Run("socket", func(t *testing.T) {
		c := serveSocket(t, m)
		// The Manager is an Imager too, and the socket serves it.
		list, err := c.Images(t.Context())
		if err != nil || !slices.ContainsFunc(list, func(im session.ImageInfo) bool { return im.Name == "mini" && im.Current }) {
			t.Errorf("Images over the socket = %+v, %v; want mini", list, err)
		}
		_, err = c.BuildImage(t.Context(), session.BuildRequest{Name: "conf-unknown"}, nil)
		if !errors.Is(err, session.ErrInvalid) {
			t.Errorf("BuildImage of an unknown image over the socket: %v, want ErrInvalid", err)
		}
		if err := c.RemoveImage(t.Context(), "conf-unknown"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("RemoveImage of an unknown image over the socket: %v, want ErrNotFound", err)
		}
		sessiontest.Suite(t, c)
	})
}
