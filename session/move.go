package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Moving a session between hosts. The source streams a bundle of the
// session (its disks sparse, its memory snapshot, checkpoints and every
// record), the target stages it, a commit step outside both (the fleet's
// ownership transaction) makes the target the owner, the target makes the
// staged session its own, and only then does the source drop its copy.

// CodeNoImageBuild is a move's target that lacks the image build the
// session's disks were made on: Move ships it, then the session.
const CodeNoImageBuild = "no-image-build"

// MoveStaged is a session a target has received and not yet made its own.
type MoveStaged struct {
	Name string `json:"name"`
	// State is what the session was when it was sent: stopped or sleeping.
	State       State  `json:"state"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// Files and Bytes count what was received: files, and their data
	// bytes (holes are not sent).
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Records is the size of the session's records stream.
	Records int64         `json:"records"`
	Took    time.Duration `json:"took"`
	// Checkpoint is set when a recovery staged the session from its
	// replica of this checkpoint (StageReplica): CommitReceived puts the
	// session on the checkpoint's disks.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// A Mover is one end of a move. The engine and the socket/TLS client
// implement it, so a fleet's router calls it alike on both hosts.
type Mover interface {
	// SendSession writes the bundle of a stopped or sleeping session to w.
	// The session is held for the whole send, so nothing starts it
	// meanwhile; a running or paused one is refused (ErrInvalidState,
	// with a hint to stop or sleep it first). It changes nothing.
	SendSession(ctx context.Context, name string, w io.Writer) error
	// ReceiveSession reads a bundle into staging, verifying every chunk's
	// hash and every path. It refuses a session that exists here or is
	// already staged (ErrExists) and one whose image build is not here
	// (ErrNotFound naming the digest). A failure leaves nothing staged.
	ReceiveSession(ctx context.Context, r io.Reader) (MoveStaged, error)
	// CommitReceived makes a staged session a session of this host, as it
	// was sent (stopped or sleeping). It is idempotent: once it has
	// succeeded, calling it again succeeds, so a caller retries it until
	// it does. Staging survives a restart for that reason.
	CommitReceived(ctx context.Context, name string) (Session, error)
	// DiscardReceived removes what is staged for name; nil when nothing
	// is.
	DiscardReceived(ctx context.Context, name string) error
	// SendSessionImage writes the image build the session's disks were
	// made on (by its digest, as built: never rebuilt) to w, for a target
	// whose ReceiveSession refused with CodeNoImageBuild.
	SendSessionImage(ctx context.Context, name string, w io.Writer) error
	// ReceiveImage stores an image build SendSessionImage wrote, each
	// chunk checked by hash; ErrExists when the build is here already.
	ReceiveImage(ctx context.Context, r io.Reader) error
	// DropSent removes this host's copy of a session sent elsewhere,
	// once the target has committed it: disks, checkpoints and records.
	// It refuses a session that is no longer stopped or sleeping.
	DropSent(ctx context.Context, name string) error
}

// MoveCommit is the step that transfers ownership: in a fleet, the
// transaction that makes the target the session's owner at a new epoch;
// on one host with no fleet, nothing. Once it returns nil the target owns
// the session, whatever happens next.
type MoveCommit func(ctx context.Context, staged MoveStaged) error

// MoveResult reports a move.
type MoveResult struct {
	Staged  MoveStaged `json:"staged"`
	Session Session    `json:"session"`
	// Took is the whole move; Sent the send and receive.
	Took time.Duration `json:"took"`
	Sent time.Duration `json:"sent"`
}

// Move moves session name from source to target: source.SendSession
// streams into target.ReceiveSession, commit transfers ownership,
// target.CommitReceived makes it the target's, source.DropSent removes
// the source's copy.
//
// A failure before commit succeeds discards the target's staging and
// leaves the source the owner, untouched. After commit the target owns
// the session: its CommitReceived is retried (every retryEvery, until ctx
// ends) and the source's copy is dropped only once it has succeeded; if
// ctx ends first, the error says so and the source keeps its copy, for
// the caller to finish the move later with CommitReceived and DropSent.
func Move(ctx context.Context, source, target Mover, name string, commit MoveCommit, logger *slog.Logger) (MoveResult, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With("session", name)
	start := time.Now()
	var res MoveResult
	var staged MoveStaged
	err := pipe(ctx, func(w io.Writer) error { return source.SendSession(ctx, name, w) }, func(r io.Reader) (err error) {
		staged, err = target.ReceiveSession(ctx, r)
		return err
	})
	var se *Error
	if errors.As(err, &se) && se.Code == CodeNoImageBuild {
		// The target lacks the build the session's disks were made on:
		// ship it as it is, then the session.
		log.Info("the target lacks the session's image build: sending it", "err", err)
		err = pipe(ctx, func(w io.Writer) error { return source.SendSessionImage(ctx, name, w) }, func(r io.Reader) error {
			return target.ReceiveImage(ctx, r)
		})
		if errors.Is(err, ErrExists) {
			err = nil // another move brought it meanwhile
		}
		if err == nil {
			err = pipe(ctx, func(w io.Writer) error { return source.SendSession(ctx, name, w) }, func(r io.Reader) (err error) {
				staged, err = target.ReceiveSession(ctx, r)
				return err
			})
		}
	}
	if err != nil {
		discard(ctx, target, name, log)
		return res, fmt.Errorf("move %q: send: %w", name, err)
	}
	res.Staged, res.Sent = staged, time.Since(start)
	if staged.Name != name {
		discard(ctx, target, staged.Name, log)
		return res, fmt.Errorf("move %q: the target staged %q: %w", name, staged.Name, ErrInvalid)
	}
	if commit != nil {
		if err := commit(ctx, staged); err != nil {
			discard(ctx, target, name, log)
			return res, fmt.Errorf("move %q: commit: %w (the source still owns it)", name, err)
		}
	}
	// The target owns the session now: never drop the source's copy
	// before the target confirms.
	for {
		res.Session, err = target.CommitReceived(ctx, name)
		if err == nil {
			break
		}
		log.Warn("the target did not take the moved session yet; retrying", "err", err)
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("move %q: committed, but the target has not taken it (%v); the source keeps its copy until it does: %w", name, err, ctx.Err())
		case <-time.After(retryEvery):
		}
	}
	if err := source.DropSent(ctx, name); err != nil {
		return res, fmt.Errorf("move %q: moved, but the source's copy remains: %w", name, err)
	}
	res.Took = time.Since(start)
	return res, nil
}

// retryEvery paces the retries of a committed move's last steps.
const retryEvery = 500 * time.Millisecond

func discard(ctx context.Context, target Mover, name string, log *slog.Logger) {
	// The move's own ctx may be what ended: discarding must still run.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := target.DiscardReceived(dctx, name); err != nil {
		log.Warn("discard the target's staging", "err", err)
	}
}

// pipe runs send into receive through a pipe and returns the first
// failure, the receiver's first (it says what it refused). The sender
// ends when its stream is read to the end or the receiver closes the
// pipe, which happens before pipe returns.
func pipe(ctx context.Context, send func(io.Writer) error, receive func(io.Reader) error) error {
	pr, pw := io.Pipe()
	sendErr := make(chan error, 1)
	go func() {
		err := send(pw)
		pw.CloseWithError(err)
		sendErr <- err
	}()
	err := receive(pr)
	pr.CloseWithError(errors.New("the receiver stopped reading"))
	serr := <-sendErr
	switch {
	case err == nil:
		return serr
	case serr != nil && !errors.Is(err, serr):
		return fmt.Errorf("%w (the sender: %v)", err, serr)
	}
	return err
}

// A Relocator moves a session to another host of its fleet (berth move):
// the fleet's Router, and the socket and TLS client, which ask the
// daemon's. A berth that is no fleet does not implement it.
type Relocator interface {
	MoveTo(ctx context.Context, name, host string) (MoveResult, error)
}
