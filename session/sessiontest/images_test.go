package sessiontest

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// The fake's commits follow the daemon's rules: the image is listed with
// its parent and label, sessions are created from it, it is removed only
// when no session and no image committed on it uses it, and neither a
// paused session nor a name of an image it did not commit is taken.
func TestFakeCommitImage(t *testing.T) {
	ctx := t.Context()
	f := New(Options{Images: []string{"mini", "debian"}})
	defer f.Close()
	if _, err := f.Create(ctx, session.CreateOptions{Name: "s1", Image: "debian"}); err != nil {
		t.Fatal(err)
	}
	res, err := f.CommitImage(ctx, session.CommitRequest{Session: "s1", Image: "app", Label: "tools in"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Parent != "debian@fake" || res.Image.Name != "app" || res.Image.Parent != "debian@fake" || res.Image.Label != "tools in" || res.State != session.StateRunning {
		t.Errorf("CommitImage = %+v", res)
	}
	if _, err := f.Create(ctx, session.CreateOptions{Name: "s2", Image: "app"}); err != nil {
		t.Fatalf("create from the committed image: %v", err)
	}
	if _, err := f.CommitImage(ctx, session.CommitRequest{Session: "s2", Image: "app2"}); err != nil {
		t.Fatal(err)
	}
	list, _ := f.Images(ctx)
	var names []string
	for _, im := range list {
		names = append(names, im.Name+"<"+im.Parent+">"+strings.Join(im.Sessions, ","))
	}
	if got := strings.Join(names, " "); got != "mini<> debian<>s1 app<debian@fake>s2 app2<app@commit1>" {
		t.Errorf("Images: %s", got)
	}
	err = f.RemoveImage(ctx, "app")
	if !errors.Is(err, &session.Error{Class: session.ErrConflict, Code: session.CodeInUse}) || !strings.Contains(err.Error(), "s2 (a session) and app2 (an image built on it)") {
		t.Errorf("RemoveImage of a used image: %v", err)
	}
	_, err = f.CommitImage(ctx, session.CommitRequest{Session: "s1", Image: "debian"})
	if !errors.Is(err, session.ErrExists) || session.FieldOf(err) != session.FieldNewImage {
		t.Errorf("CommitImage over an image not committed: %v, want ErrExists for the new image", err)
	}
	f.Pause(ctx, "s1")
	if _, err := f.CommitImage(ctx, session.CommitRequest{Session: "s1", Image: "app3"}); !errors.Is(err, session.ErrInvalidState) {
		t.Errorf("CommitImage of a paused session: %v, want ErrInvalidState", err)
	}
	if err := f.RemoveImage(ctx, "debian"); !errors.Is(err, session.ErrUnsupported) {
		t.Errorf("RemoveImage of a given image: %v, want ErrUnsupported", err)
	}
	f.Delete(ctx, "s2")
	if err := f.RemoveImage(ctx, "app2"); err != nil {
		t.Fatal(err)
	}
	if err := f.RemoveImage(ctx, "app"); err != nil {
		t.Errorf("RemoveImage once nothing uses it: %v", err)
	}
	if _, err := f.Create(ctx, session.CreateOptions{Name: "s3", Image: "app"}); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("create from a removed image: %v", err)
	}
}
