package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Replicas and recovery: the answer to a host that is gone. A replica is
// a copy of one checkpoint of a session kept on another host, in that
// host's replicas area (not a session there): the checkpoint's files
// (disks, memory snapshot if it has one) and the session's records, sent
// as a move bundle restricted to that checkpoint, each chunk checked by
// hash. Recovery stages a replica as a move's staging, a commit step (the
// fleet's transaction, once etcd has expired the owner's lease) makes the
// replica's host the owner at a new epoch, and the ordinary
// CommitReceived makes it a session there, on the checkpoint's disks.

// Replica is one checkpoint copy a host keeps.
type Replica struct {
	Session    string `json:"session"`
	Checkpoint string `json:"checkpoint"`
	// Host keeps it (set by a fleet; "" from an engine, which is the host).
	Host      string        `json:"host,omitempty"`
	Label     string        `json:"label,omitempty"`
	Memory    bool          `json:"memory,omitempty"`
	System    bool          `json:"system,omitempty"`
	TakenAt   time.Time     `json:"taken_at"` // the checkpoint's CreatedAt
	CopiedAt  time.Time     `json:"copied_at"`
	Bytes     int64         `json:"bytes"` // data bytes received (holes are not sent)
	Files     int           `json:"files"`
	Took      time.Duration `json:"took"`
	ImageSent bool          `json:"image_sent,omitempty"` // the image build was shipped first
}

// A Replicator is one end of a replication, and of a recovery's staging:
// the engine, and the socket/TLS client, so a fleet's router calls it
// alike on both hosts.
type Replicator interface {
	// SendCheckpoint writes the replica bundle of checkpoint id of session
	// name to w: the checkpoint's files and the session's records. The
	// session may be in any state (a checkpoint never changes once made).
	SendCheckpoint(ctx context.Context, name, id string, w io.Writer) error
	// ReceiveReplica stores a replica bundle in this host's replicas
	// area, verifying every chunk's hash and every path; it replaces an
	// earlier copy of the same checkpoint. It refuses a bundle whose
	// image build is not here (CodeNoImageBuild, as ReceiveSession does).
	// A failure leaves nothing new.
	ReceiveReplica(ctx context.Context, r io.Reader) (Replica, error)
	// Replicas lists the replicas this host keeps of session name (all
	// sessions' with "").
	Replicas(ctx context.Context, name string) ([]Replica, error)
	// StageReplica stages the replica of checkpoint id of session name as
	// a move's staging (MoveStaged.Checkpoint says so), for
	// CommitReceived to make it a session of this host on the
	// checkpoint's disks, stopped (sleeping on its memory when the
	// checkpoint has it). The replica is kept. Staged already from the
	// same checkpoint, it answers that staging; it refuses when the
	// session is here, or staged from anything else.
	StageReplica(ctx context.Context, name, id string) (MoveStaged, error)
	// DropReplica removes the replica; nil when there is none.
	DropReplica(ctx context.Context, name, id string) error
}

// RecoverOptions configure a recovery (berth recover).
type RecoverOptions struct {
	// From is the checkpoint whose replica the session is started from.
	From string `json:"from"`
	// On is the host that keeps the replica and takes the session.
	On string `json:"on"`
	// Force does it; without it the recovery is refused with what it
	// would do.
	Force bool `json:"force,omitempty"`
}

// RecoverResult reports a recovery.
type RecoverResult struct {
	Session Session `json:"session"`
	// From is the host that owned the session and is gone.
	From       string `json:"from"`
	Checkpoint string `json:"checkpoint"`
	// Epoch is the session's new epoch, on RecoverOptions.On.
	Epoch int64         `json:"epoch"`
	Took  time.Duration `json:"took"`
}

// A Recoverer keeps checkpoint replicas on other hosts of a fleet and
// starts a session of a gone host from one: the fleet's Router, and the
// socket and TLS client, which ask the daemon's.
type Recoverer interface {
	// ReplicateCheckpoint copies checkpoint id of session name to host to
	// (berth checkpoint replicate NAME ID --to H).
	ReplicateCheckpoint(ctx context.Context, name, id, to string) (Replica, error)
	// Recover starts session name on opts.On from its replica of
	// checkpoint opts.From, once the fleet's etcd has expired the owner's
	// lease (berth recover NAME --from ID --on H --force).
	Recover(ctx context.Context, name string, opts RecoverOptions) (RecoverResult, error)
}

// Replicate sends checkpoint id of session name from source to target's
// replicas area. A target that lacks the session's image build
// (CodeNoImageBuild) is sent the build first, as Move does.
func Replicate(ctx context.Context, source interface {
	Replicator
	Mover
}, target interface {
	Replicator
	Mover
}, name, id string, logger *slog.Logger) (Replica, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	var rep Replica
	send := func() error {
		return pipe(ctx, func(w io.Writer) error { return source.SendCheckpoint(ctx, name, id, w) }, func(r io.Reader) (err error) {
			rep, err = target.ReceiveReplica(ctx, r)
			return err
		})
	}
	err := send()
	var se *Error
	imageSent := false
	if errors.As(err, &se) && se.Code == CodeNoImageBuild {
		logger.Info("the replica's host lacks the session's image build: sending it", "session", name, "err", err)
		err = pipe(ctx, func(w io.Writer) error { return source.SendSessionImage(ctx, name, w) }, func(r io.Reader) error {
			return target.ReceiveImage(ctx, r)
		})
		if errors.Is(err, ErrExists) {
			err = nil
		}
		if err == nil {
			imageSent = true
			err = send()
		}
	}
	if err != nil {
		return rep, fmt.Errorf("replicate checkpoint %s of %q: %w", id, name, err)
	}
	if rep.Session != name || rep.Checkpoint != id {
		return rep, fmt.Errorf("replicate checkpoint %s of %q: the target kept %s of %q: %w", id, name, rep.Checkpoint, rep.Session, ErrInvalid)
	}
	rep.Took, rep.ImageSent = time.Since(start), imageSent
	return rep, nil
}
