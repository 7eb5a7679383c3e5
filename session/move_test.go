package session_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// memHost is a Mover over maps: a session is its bytes.
type memHost struct {
	mu       sync.Mutex
	sessions map[string][]byte
	staged   map[string][]byte
	// Failures to inject, by step; commitFails counts failing
	// CommitReceived calls before one succeeds.
	sendCutAt   int
	receiveFail error
	commitFails int
	dropFail    error
	// needImage: ReceiveSession refuses until an image arrives.
	needImage bool
	images    int
}

func newMemHost() *memHost {
	return &memHost{sessions: map[string][]byte{}, staged: map[string][]byte{}, sendCutAt: -1}
}

func (h *memHost) SendSession(ctx context.Context, name string, w io.Writer) error {
	h.mu.Lock()
	b, ok := h.sessions[name]
	h.mu.Unlock()
	if !ok {
		return fmt.Errorf("session %q: %w", name, session.ErrNotFound)
	}
	msg := append([]byte(name+"\n"), b...)
	if h.sendCutAt >= 0 {
		w.Write(msg[:h.sendCutAt])
		return errors.New("the source's disk failed mid-send")
	}
	_, err := w.Write(msg)
	return err
}

func (h *memHost) ReceiveSession(ctx context.Context, r io.Reader) (session.MoveStaged, error) {
	b, err := io.ReadAll(r)
	name, body, ok := strings.Cut(string(b), "\n")
	h.mu.Lock()
	defer h.mu.Unlock()
	if ok {
		h.staged[name] = []byte(body) // staged as it arrives, as the engine does
	}
	if err != nil {
		return session.MoveStaged{}, err
	}
	if h.receiveFail != nil {
		return session.MoveStaged{}, h.receiveFail
	}
	if h.needImage && h.images == 0 {
		delete(h.staged, name)
		return session.MoveStaged{}, &session.Error{Class: session.ErrNotFound, Code: session.CodeNoImageBuild, Msg: "no build abc of image mini"}
	}
	return session.MoveStaged{Name: name, Bytes: int64(len(body))}, nil
}

func (h *memHost) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.commitFails > 0 {
		h.commitFails--
		return session.Session{}, fmt.Errorf("the target restarts: %w", session.ErrUnavailable)
	}
	if b, ok := h.staged[name]; ok {
		h.sessions[name] = b
		delete(h.staged, name)
	}
	if _, ok := h.sessions[name]; !ok {
		return session.Session{}, session.ErrNotFound
	}
	return session.Session{Name: name, State: session.StateStopped}, nil
}

func (h *memHost) DiscardReceived(ctx context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.staged, name)
	return nil
}

func (h *memHost) DropSent(ctx context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dropFail != nil {
		return h.dropFail
	}
	delete(h.sessions, name)
	return nil
}

func (h *memHost) SendSessionImage(ctx context.Context, name string, w io.Writer) error {
	_, err := w.Write([]byte("image of " + name))
	return err
}

func (h *memHost) ReceiveImage(ctx context.Context, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if string(b) != "image of s" {
		return fmt.Errorf("image %q", b)
	}
	h.images++
	return nil
}

func (h *memHost) has(name string) (session, staged bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, a := h.sessions[name]
	_, b := h.staged[name]
	return a, b
}

func TestMove(t *testing.T) {
	disk := bytes.Repeat([]byte("workspace "), 1000)
	errCommit := errors.New("etcd: the owner key moved on")
	cases := []struct {
		name   string
		setup  func(src, dst *memHost)
		commit func(ctx context.Context, s session.MoveStaged) error
		ctx    time.Duration // 0: no deadline
		// Where the session is after the move: on the source, on the
		// target, staged on the target.
		wantErr                   bool
		onSource, onTarget, stage bool
	}{
		{name: "moves", onTarget: true},
		{name: "ships the image the target lacks", setup: func(src, dst *memHost) { dst.needImage = true }, onTarget: true},
		{name: "send cut off", setup: func(src, dst *memHost) { src.sendCutAt = 100 }, wantErr: true, onSource: true},
		{name: "receive refuses", setup: func(src, dst *memHost) { dst.receiveFail = session.ErrExists }, wantErr: true, onSource: true},
		{name: "commit refused", commit: func(context.Context, session.MoveStaged) error { return errCommit }, wantErr: true, onSource: true},
		// After the commit, the target's failures are retried and the
		// source keeps its copy until it answers.
		{name: "target slow to take it", setup: func(src, dst *memHost) { dst.commitFails = 3 }, onTarget: true},
		{name: "target never takes it", setup: func(src, dst *memHost) { dst.commitFails = 1 << 30 }, ctx: 2 * time.Second,
			wantErr: true, onSource: true, stage: true},
		{name: "drop fails", setup: func(src, dst *memHost) { src.dropFail = errors.New("disk gone") }, wantErr: true, onSource: true, onTarget: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, dst := newMemHost(), newMemHost()
			src.sessions["s"] = disk
			if c.setup != nil {
				c.setup(src, dst)
			}
			ctx := t.Context()
			if c.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.ctx)
				defer cancel()
			}
			committed := false
			commit := func(ctx context.Context, s session.MoveStaged) error {
				if _, staged := dst.has("s"); !staged {
					t.Error("commit called before the target staged the session")
				}
				if c.commit != nil {
					return c.commit(ctx, s)
				}
				committed = true
				return nil
			}
			res, err := session.Move(ctx, src, dst, "s", commit, nil)
			if (err != nil) != c.wantErr {
				t.Fatalf("Move = %+v, %v; want error %v", res, err, c.wantErr)
			}
			onSource, _ := src.has("s")
			onTarget, staged := dst.has("s")
			if onSource != c.onSource || onTarget != c.onTarget || staged != c.stage {
				t.Errorf("after the move: on source %v, on target %v, staged %v; want %v, %v, %v (err %v)",
					onSource, onTarget, staged, c.onSource, c.onTarget, c.stage, err)
			}
			if onTarget && !bytes.Equal(dst.sessions["s"], disk) {
				t.Error("the target's copy differs")
			}
			if !committed && onTarget {
				t.Error("the target took the session without the commit")
			}
			if c.wantErr && committed && !onSource && !onTarget {
				t.Error("the session is nowhere")
			}
		})
	}
}
