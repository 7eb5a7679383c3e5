package engine

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/store"
	"github.com/berthvm/berth/vmm"
)

// newImageManager is a Manager on the stub driver with an image store in
// its data directory, for what needs images but no VM.
func newImageManager(t *testing.T) *Manager {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "store"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(context.Background(), st, Config{DataDir: dir, Floor: 1, StatsInterval: time.Hour,
		Images:  &image.Store{Dir: filepath.Join(dir, "images")},
		Drivers: map[string]vmm.Driver{"qemu": stubDriver{}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); st.Close() })
	return m
}

// writeBuild leaves a build of im in the store as the builder does: its
// manifest, (empty) kernel, initramfs and layer files, and, when current,
// the name's pointer to it.
func writeBuild(t *testing.T, m *Manager, im image.Image, current bool) {
	t.Helper()
	dir := filepath.Join(m.cfg.Images.Dir, im.Name, im.Digest)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := []string{"vmlinuz", "initramfs.cpio.gz"}
	for _, l := range im.Layers {
		files = append(files, l.File)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(im)
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if current {
		if err := os.WriteFile(filepath.Join(m.cfg.Images.Dir, im.Name, "current"), []byte(im.Digest+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// agentlessVM is a running VM whose agent hangs up at once and whose VMM
// exits when killed: a stop goes through to the end without an agent.
type agentlessVM struct {
	stubVM
	once sync.Once
}

func (v *agentlessVM) DialAgent(context.Context) (net.Conn, error) {
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

func (v *agentlessVM) Kill(context.Context) error {
	v.once.Do(func() { close(v.done) })
	return nil
}

// Replace reports what it dropped in the measure the session showed
// before it (the guest's own figure while it ran), not the host file's
// allocation, which counts the filesystem's metadata too: the warning a
// front end printed and the report agree.
func TestReplaceReportsTheSystemUseShown(t *testing.T) {
	m := newImageManager(t)
	writeBuild(t, m, image.Image{Name: "mini", Digest: "d1"}, true)
	vm := &agentlessVM{stubVM: stubVM{done: make(chan struct{})}}
	s := m.addRunning(t, "r", vm)
	if err := os.MkdirAll(s.dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	// The disk's file holds 332 KiB; the guest counts 80 KiB used.
	held := make([]byte, 332<<10)
	rand.Read(held)
	if err := os.WriteFile(s.sysPath(), held, 0o600); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.rec.SystemUUID, s.rec.SystemBytes = "sys-uuid", 1<<30
	s.stats = guest.Stats{SystemSize: 1 << 30, SystemUsed: 80 << 10}
	s.mu.Unlock()
	ctx := context.Background()

	shown, err := m.Get(ctx, "r")
	if err != nil || shown.SystemUsed != 80<<10 {
		t.Fatalf("Get = system used %d, %v; want the guest's 80 KiB", shown.SystemUsed, err)
	}
	// The stub driver boots nothing, so Replace fails after the drop;
	// what it dropped is reported all the same.
	res, _ := m.Replace(ctx, "r", session.ReplaceOptions{})
	if res.Dropped != shown.SystemUsed {
		t.Errorf("Replace dropped %s; the session showed %s before it", session.FormatBytes(res.Dropped), session.FormatBytes(shown.SystemUsed))
	}
	tl, err := m.Timeline(ctx, "r", 0)
	if err != nil {
		t.Fatal(err)
	}
	note := ""
	for _, ev := range tl {
		if strings.HasPrefix(ev.Message, "replaced the VM") {
			note = ev.Message
		}
	}
	if want := session.FormatBytes(shown.SystemUsed) + " of system changes dropped"; !strings.Contains(note, want) {
		t.Errorf("timeline note %q, want it to say %q", note, want)
	}
}

// image ls counts the packages in an image's root, as its build installed
// them, not only those its recipe asked for.
func TestImagesCountInstalledPackages(t *testing.T) {
	layers := []image.Layer{{File: "layer-0.img", UUID: "u0"}, {File: "layer-1.img", UUID: "u1"}}
	for _, c := range []struct {
		name string
		im   image.Image
		want int
	}{
		{"recipe on debian-minimal, none asked", image.Image{Name: "tools", Digest: "d1", Layers: layers, Installed: 89}, 89},
		{"debian, some asked", image.Image{Name: "debian", Digest: "d2", Layers: layers[:1], Packages: []string{"git", "python3"}, Installed: 240}, 240},
		{"a manifest without the count", image.Image{Name: "old", Digest: "d3", Layers: layers[:1], Packages: []string{"git", "python3"}}, 2},
		{"mini", image.Image{Name: "mini", Digest: "d4"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newImageManager(t)
			writeBuild(t, m, c.im, true)
			list, err := m.Images(context.Background())
			if err != nil || len(list) != 1 {
				t.Fatalf("Images = %+v, %v", list, err)
			}
			if list[0].Packages != c.want {
				t.Errorf("Images: %s has %d packages, want %d", c.im.Name, list[0].Packages, c.want)
			}
		})
	}
}

// An image an older berth imported says what its record lacks: image ls
// lists it, an export (which needs the blobs it came as) and a new
// session (which needs its config) are refused in one line saying to
// import it again; an import that has them, a rootfs tarball (which has
// no config) and berth's own images lack nothing.
func TestOlderImportsSayToImportAgain(t *testing.T) {
	m := newImageManager(t)
	ctx := t.Context()
	blobs := []image.Blob{{Digest: "sha256:11", DiffID: "sha256:11", Size: 1}}
	for _, im := range []image.Image{
		{Name: "noblobs", Digest: "n1", Source: "docker-archive:/a.tar", SourceDigest: "sha256:aa", Config: &image.Config{User: "app"}, Layers: []image.Layer{{File: "layer-0.img", UUID: "u0"}}},
		{Name: "noconfig", Digest: "c1", Source: "oci-layout:/b", SourceDigest: "sha256:bb", Layers: []image.Layer{{File: "layer-0.img", UUID: "u1", Blobs: blobs}}},
		{Name: "neither", Digest: "e1", Source: "oci-archive:/c.tar", SourceDigest: "sha256:cc", Layers: []image.Layer{{File: "layer-0.img", UUID: "u2"}}},
		{Name: "fresh", Digest: "f1", Source: "docker-archive:/d.tar", SourceDigest: "sha256:dd", Config: &image.Config{}, ConfigBlob: "sha256:22", Layers: []image.Layer{{File: "layer-0.img", UUID: "u3", Blobs: blobs}}},
		{Name: "tarball", Digest: "t1", Source: "rootfs:/e.tar", SourceDigest: "sha256:ee", Layers: []image.Layer{{File: "layer-0.img", UUID: "u4", Blobs: blobs}}},
		{Name: "recipe", Digest: "r1", Source: "/r.toml", Parent: "fresh@f1", Layers: []image.Layer{{File: "layer-0.img", UUID: "u3"}}},
		{Name: "committed", Digest: "s1", Source: "session:x", Parent: "noblobs@n1", Config: &image.Config{User: "app"}, Layers: []image.Layer{{File: "layer-0.img", UUID: "u0"}}},
	} {
		writeBuild(t, m, im, true)
	}
	list, err := m.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lacks := map[string]string{}
	for _, i := range list {
		lacks[i.Name] = strings.Join(i.Lacks, ",")
	}
	want := map[string]string{"noblobs": "blobs", "noconfig": "config", "neither": "blobs,config", "fresh": "", "tarball": "", "recipe": "", "committed": ""}
	for name, w := range want {
		if lacks[name] != w {
			t.Errorf("image ls: %s lacks %q, want %q", name, lacks[name], w)
		}
	}
	oneLine := func(err error, what string) {
		t.Helper()
		if !errors.Is(err, session.ErrInvalid) || !strings.Contains(err.Error(), "did not keep "+what) ||
			!strings.Contains(err.Error(), "import it again") || strings.Contains(err.Error(), "\n") {
			t.Errorf("refusal = %v, want ErrInvalid saying on one line that it lacks %s and to import it again", err, what)
		}
	}
	for _, name := range []string{"noblobs", "neither"} {
		_, err := m.ExportImage(ctx, session.ExportRequest{Name: name}, func(session.ImageExport) (io.Writer, error) {
			t.Errorf("export of %s opened its output", name)
			return io.Discard, nil
		}, nil)
		oneLine(err, "the blobs it came as")
	}
	for _, name := range []string{"noconfig", "neither"} {
		_, err := m.Create(ctx, session.CreateOptions{Name: "s-" + name, Image: name})
		oneLine(err, "its config")
		if _, gerr := m.Get(ctx, "s-"+name); gerr == nil {
			t.Errorf("a refused create left session s-%s", name)
		}
	}
}
