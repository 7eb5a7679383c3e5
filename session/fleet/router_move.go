package fleet

import (
	"context"
	"fmt"
	"io"

	"github.com/berthvm/berth/session"
)

var (
	_ session.Mover     = (*Router)(nil)
	_ session.Relocator = (*Router)(nil)
)

// MoveTo moves session name to host to (berth move NAME --to H). A front
// door that does not own the session forwards the call to its owner, so
// the bundle goes from the owner straight to the target; the owner sends
// it, the target stages it, Transfer makes the target the owner at a new
// epoch, the target takes it, and only then does the owner drop its copy.
func (r *Router) MoveTo(ctx context.Context, name, to string) (session.MoveResult, error) {
	if err := ValidateHostID(to); err != nil {
		return session.MoveResult{}, err
	}
	t, err := r.route(ctx, name)
	if err != nil {
		return session.MoveResult{}, err
	}
	if t.remote {
		rl, ok := t.svc.(session.Relocator)
		if !ok {
			return session.MoveResult{}, fmt.Errorf("host %s does not move sessions: %w", t.host, session.ErrUnsupported)
		}
		return rl.MoveTo(t.ctx, name, to)
	}
	return r.moveHere(t.ctx, name, to, t.epoch)
}

// moveHere moves name, which this host holds at epoch, to host to.
func (r *Router) moveHere(ctx context.Context, name, to string, epoch int64) (session.MoveResult, error) {
	if epoch == 0 {
		return session.MoveResult{}, &session.Error{Class: session.ErrInvalidState,
			Msg: fmt.Sprintf("session %s was made before host %s joined the fleet and has no owner in it: it cannot move", name, r.cfg.Self)}
	}
	if to == r.cfg.Self {
		return session.MoveResult{}, &session.Error{Class: session.ErrInvalid, Msg: fmt.Sprintf("session %s is on host %s already", name, to)}
	}
	src, ok := r.cfg.Local.(session.Mover)
	if !ok {
		return session.MoveResult{}, fmt.Errorf("this host's engine does not move sessions: %w", session.ErrUnsupported)
	}
	dst, err := r.client(ctx, to)
	if err != nil {
		return session.MoveResult{}, fmt.Errorf("move %s to %s: %w", name, to, err)
	}
	commit := func(ctx context.Context, _ session.MoveStaged) error {
		next, err := Transfer(ctx, r.cli, name, r.cfg.Self, epoch, to)
		if err == nil {
			r.log.Info("moved the owner", "session", name, "to", to, "epoch", next)
		}
		return err
	}
	return session.Move(ctx, src, dst, name, commit, r.log)
}

// The host-to-host calls of a move are this host's own (the bundle of
// its copy, its staging): they go to the engine, never forwarded.

func (r *Router) mover() (session.Mover, error) {
	mv, ok := r.cfg.Local.(session.Mover)
	if !ok {
		return nil, fmt.Errorf("this host's engine does not move sessions: %w", session.ErrUnsupported)
	}
	return mv, nil
}

func (r *Router) SendSession(ctx context.Context, name string, w io.Writer) error {
	mv, err := r.mover()
	if err != nil {
		return err
	}
	return mv.SendSession(ctx, name, w)
}

func (r *Router) ReceiveSession(ctx context.Context, rd io.Reader) (session.MoveStaged, error) {
	mv, err := r.mover()
	if err != nil {
		return session.MoveStaged{}, err
	}
	return mv.ReceiveSession(ctx, rd)
}

// CommitReceived makes the staged session this host's, at the epoch its
// owner key holds now: the move's transaction named this host before
// the source asked.
func (r *Router) CommitReceived(ctx context.Context, name string) (session.Session, error) {
	mv, err := r.mover()
	if err != nil {
		return session.Session{}, err
	}
	s, err := mv.CommitReceived(ctx, name)
	if err != nil {
		return s, err
	}
	if o, ok, lerr := r.lookup(ctx, name, true); lerr == nil && ok && o.host == r.cfg.Self {
		r.setEpoch(ctx, name, o.epoch)
		s.Epoch = o.epoch
	}
	s.Host = r.cfg.Self
	return s, nil
}

func (r *Router) DiscardReceived(ctx context.Context, name string) error {
	mv, err := r.mover()
	if err != nil {
		return err
	}
	return mv.DiscardReceived(ctx, name)
}

func (r *Router) SendSessionImage(ctx context.Context, name string, w io.Writer) error {
	mv, err := r.mover()
	if err != nil {
		return err
	}
	return mv.SendSessionImage(ctx, name, w)
}

func (r *Router) ReceiveImage(ctx context.Context, rd io.Reader) error {
	mv, err := r.mover()
	if err != nil {
		return err
	}
	return mv.ReceiveImage(ctx, rd)
}

func (r *Router) DropSent(ctx context.Context, name string) error {
	mv, err := r.mover()
	if err != nil {
		return err
	}
	return mv.DropSent(ctx, name)
}
