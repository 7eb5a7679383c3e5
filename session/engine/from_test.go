package engine

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/berthvm/berth/guest/image"
	"github.com/berthvm/berth/session"
)

// A create from a checkpoint is refused, before anything is made, with
// one line naming the from field: of a session that does not exist, of
// a checkpoint it does not have, of one whose image is gone; and what the
// checkpoint decides cannot be chosen.
func TestCreateFromRefusals(t *testing.T) {
	ctx := context.Background()
	m := newSpaceManager(t, 0)
	m.cfg.Images = &image.Store{Dir: t.TempDir()} // holds no image at all
	s := m.addStopped(t, "src", map[int64][]byte{0: randBytes(4096)})
	s.rec.Image, s.rec.ImageDigest = "app", "sha256:0123abcd"
	if _, err := m.Checkpoint(ctx, "src", session.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from  string
		opts  session.CreateOptions
		class error
		field string
		msg   string
	}{
		{"ghost@c1", session.CreateOptions{}, session.ErrNotFound, session.FieldFrom, `from ghost@c1: there is no session "ghost" to take a checkpoint of`},
		{"src@c7", session.CreateOptions{}, session.ErrNotFound, session.FieldFrom, `from src@c7: session "src" has no checkpoint "c7"`},
		{"src@c1", session.CreateOptions{}, session.ErrNotFound, session.FieldFrom, "from src@c1: checkpoint c1 runs on image app@sha256:0123abcd, which is gone"},
		{"src", session.CreateOptions{}, session.ErrNotFound, session.FieldFrom, "from src@c1: checkpoint c1 runs on image app@sha256:0123abcd, which is gone"},
		{"src@", session.CreateOptions{}, session.ErrInvalid, session.FieldFrom, `from "src@": the checkpoint id after @ is empty or malformed`},
		{"src", session.CreateOptions{Image: "mini"}, session.ErrInvalid, session.FieldImage, "image \"mini\" cannot be chosen"},
	} {
		c.opts.Name, c.opts.From = "new", c.from
		_, err := m.Create(ctx, c.opts)
		if !errors.Is(err, c.class) || session.FieldOf(err) != c.field || !strings.HasPrefix(err.Error(), c.msg) || strings.Contains(err.Error(), "\n") {
			t.Errorf("create --from %s: %v; want %v of field %q, one line starting %q", c.from, err, c.class, c.field, c.msg)
		}
	}
	if _, err := m.Get(ctx, "new"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("a refused create from a checkpoint left the session: %v", err)
	}
	if _, err := os.Stat(m.sessionDir("new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused create from a checkpoint left its directory: %v", err)
	}
}
