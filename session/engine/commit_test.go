package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/vmm"
)

// What a commit is refused for, each as one line with its class, the
// field or code at fault and the figures where there are some; nothing
// is left behind.
func TestCommitImageRefusals(t *testing.T) {
	m := newImageManager(t)
	ctx := t.Context()
	writeBuild(t, m, image.Image{Name: "mini", Digest: "m1"}, true)
	writeBuild(t, m, image.Image{Name: "tools", Digest: "t1", Source: "/recipes/tools.toml", Layers: []image.Layer{{File: "layer-0.img", UUID: "u0"}}}, true)
	var deep []image.Layer
	for i := range vmm.MaxLayers {
		deep = append(deep, image.Layer{File: fmt.Sprintf("layer-%d.img", i), UUID: fmt.Sprint("u", i)})
	}
	writeBuild(t, m, image.Image{Name: "deep", Digest: "d1", Source: "session:x", Parent: "tools@t1", Layers: deep}, true)
	writeBuild(t, m, image.Image{Name: "ontools", Digest: "o1", Source: "/recipes/ontools.toml", Parent: "tools@t1", Layers: []image.Layer{{File: "layer-0.img", UUID: "u0"}}}, true)
	onImage := func(name, img, digest string) *sess {
		s := m.addRunning(t, name, &stubVM{done: make(chan struct{})})
		s.mu.Lock()
		s.rec.Image, s.rec.ImageDigest, s.rec.State = img, digest, string(session.StateStopped)
		s.vm = nil
		s.mu.Unlock()
		if err := os.MkdirAll(s.dir(), 0o755); err != nil {
			t.Fatal(err)
		}
		return s
	}
	onImage("tiny", "mini", "m1")
	onImage("deep", "deep", "d1")
	full := onImage("full", "tools", "t1")
	if err := os.WriteFile(full.sysPath(), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	paused := onImage("paused", "tools", "t1")
	paused.mu.Lock()
	paused.rec.State = string(session.StatePaused)
	paused.mu.Unlock()

	for _, tt := range []struct {
		name  string
		req   session.CommitRequest
		floor int64
		class error
		field string
		code  string
		want  string
	}{
		{name: "an unknown session", req: session.CommitRequest{Session: "nope", Image: "app"}, class: session.ErrNotFound, field: session.FieldSession, want: `session "nope" does not exist`},
		{name: "a shipped name", req: session.CommitRequest{Session: "full", Image: "debian"}, class: session.ErrExists, field: session.FieldNewImage, want: "berth's own"},
		{name: "a recipe's name", req: session.CommitRequest{Session: "full", Image: "tools"}, class: session.ErrExists, field: session.FieldNewImage, want: "exists already, from /recipes/tools.toml"},
		// A parent makes no commit: a recipe on an image has one too.
		{name: "a recipe on an image", req: session.CommitRequest{Session: "full", Image: "ontools"}, class: session.ErrExists, field: session.FieldNewImage, want: "exists already, from /recipes/ontools.toml"},
		{name: "no system disk", req: session.CommitRequest{Session: "tiny", Image: "app"}, class: session.ErrInvalid, code: session.CodeNoSystemDisk, want: "whose root is its initramfs"},
		{name: "no layer left", req: session.CommitRequest{Session: "deep", Image: "app"}, class: session.ErrInvalid, code: session.CodeLayers, want: fmt.Sprintf("has %d layers, the most a VM stacks", vmm.MaxLayers)},
		{name: "paused", req: session.CommitRequest{Session: "paused", Image: "app"}, class: session.ErrInvalidState, want: `cannot commit session "paused": it is paused`},
		// A floor above any disk's free space.
		{name: "no room", req: session.CommitRequest{Session: "full", Image: "app"}, floor: 1 << 60, class: session.ErrNoSpace, want: "keeps 1.0 EiB free"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m.cfg.Floor = max(tt.floor, 1)
			_, err := m.CommitImage(ctx, tt.req)
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("CommitImage = %v, want %v saying %q on one line", err, tt.class, tt.want)
			}
			if tt.field != "" && session.FieldOf(err) != tt.field || tt.code != "" && session.CodeOf(err) != tt.code {
				t.Errorf("CommitImage = %v: field %q code %q, want %q %q", err, session.FieldOf(err), session.CodeOf(err), tt.field, tt.code)
			}
		})
	}
	if _, err := os.Stat(m.cfg.Images.Dir + "/app"); err == nil {
		t.Error("a refused commit left an image directory")
	}
	if left, _ := os.ReadDir(m.cfg.DataDir); len(left) > 0 {
		for _, e := range left {
			if strings.HasPrefix(e.Name(), commitWorkPrefix) {
				t.Errorf("a refused commit left %s", e.Name())
			}
		}
	}
}

// The room a copy needs, refused with the figures: what it needs, what
// is free, and the floor kept.
func TestRoomFor(t *testing.T) {
	m := newImageManager(t)
	m.cfg.Floor = 1 << 20
	if err := m.roomFor("copy", 1<<10); err != nil {
		t.Fatalf("roomFor 1 KiB = %v", err)
	}
	err := m.roomFor("copy", 1<<60)
	var se *session.Error
	if !errors.As(err, &se) || se.Class != session.ErrNoSpace || !errors.Is(err, syscall.ENOSPC) ||
		!strings.HasPrefix(se.Msg, "cannot copy: it needs 1.0 EiB and the data directory "+m.cfg.DataDir+" has ") || !strings.HasSuffix(se.Msg, "free, and keeps 1.0 MiB free (free_space_floor)") {
		t.Errorf("roomFor 1 EiB = %v", err)
	}
}

// image rm names every session and every image committed or built on an
// image,
// with its code; an image's own later builds are no children of it.
func TestRemoveImageNamesItsUsers(t *testing.T) {
	m := newImageManager(t)
	ctx := t.Context()
	l := []image.Layer{{File: "layer-0.img", UUID: "u0"}}
	writeBuild(t, m, image.Image{Name: "base", Digest: "b1", Source: "/r.toml", Layers: l}, true)
	writeBuild(t, m, image.Image{Name: "app", Digest: "a1", Source: "session:s", Parent: "base@b1", Layers: l}, true)
	writeBuild(t, m, image.Image{Name: "app", Digest: "a2", Source: "session:t", Parent: "app@a1", Layers: l}, false)
	writeBuild(t, m, image.Image{Name: "app2", Digest: "c1", Source: "session:s", Parent: "base@b0", Layers: l}, true)
	// A recipe built on base ("base = image:base") is its child too.
	writeBuild(t, m, image.Image{Name: "tools", Digest: "r1", Source: "/tools.toml", Parent: "base@b1", Layers: l}, true)
	s := m.addRunning(t, "user", &stubVM{done: make(chan struct{})})
	s.mu.Lock()
	s.rec.Image, s.rec.ImageDigest = "base", "b1"
	s.mu.Unlock()

	err := m.RemoveImage(ctx, "base")
	if !errors.Is(err, &session.Error{Class: session.ErrConflict, Code: session.CodeInUse}) ||
		!strings.Contains(err.Error(), `image "base" is used by user (a session) and app, app2, tools (images built on it)`) {
		t.Errorf("RemoveImage(base) = %v", err)
	}
	if err := m.RemoveImage(ctx, "app"); err != nil {
		t.Errorf("RemoveImage(app), whose only child is its own build: %v", err)
	}
}
