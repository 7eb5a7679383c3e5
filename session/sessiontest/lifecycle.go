package sessiontest

import (
	"context"
	"fmt"
	"slices"

	"github.com/berthvm/berth/session"
)

// Create makes a session and boots it: the returned session is running.
func (f *Fake) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	if err := f.enter(ctx, "Create"); err != nil {
		return session.Session{}, err
	}
	if opts.From != "" {
		return f.createFrom(ctx, opts)
	}
	if err := f.validateCreate(&opts); err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sessions[opts.Name]; ok {
		return session.Session{}, fmt.Errorf("session %q already exists (pick another name or delete it first): %w", opts.Name, session.ErrExists)
	}
	now := f.now()
	s := &fakeSession{
		info: session.Session{
			Name:      opts.Name,
			State:     session.StateCreating,
			Cause:     "created",
			CPUs:      opts.CPUs,
			MemoryMiB: opts.MemoryMiB,
			DiskBytes: opts.DiskBytes,
			Image:     opts.Image,
			VMM:       opts.VMM,
			CreatedAt: now,
			// Measured at boot, as the Manager does; the fake's figure
			// is always current after that.
			WorkspaceMeasuredAt: now,
			// As the Manager reports them for an image without a
			// system disk.
			RootDirectory: "/workspace",
			HomeDirectory: "/root",
			Net:           opts.Net,
		},
		root: newDir(now),
	}
	f.sessions[opts.Name] = s
	f.publishLocked(ctx, s, session.Event{Kind: session.EventState})
	f.bootLocked(ctx, s, causeBy(ctx, "created"))
	return s.info, nil
}

// validateCreate fills in the defaults and applies the contract's create
// rules, as the Manager does.
func (f *Fake) validateCreate(opts *session.CreateOptions) error {
	*opts = opts.WithDefaults(session.CreateOptions{CPUs: f.opts.CPUs, MemoryMiB: f.opts.MemoryMiB, DiskBytes: f.opts.DiskBytes,
		Image: f.opts.Image, VMM: f.opts.VMM})
	net, err := session.ValidateCreate(*opts, f.opts.Limits)
	if err != nil {
		return err
	}
	opts.Net = net
	if !slices.Contains(f.opts.Images, opts.Image) {
		return &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Msg: fmt.Sprintf("%q is not built", opts.Image), Hint: "build it from a recipe, or list the images there are"}
	}
	if opts.VMM != "qemu" && opts.VMM != "cloud-hypervisor" {
		return fmt.Errorf("unknown VMM %q: want qemu or cloud-hypervisor: %w", opts.VMM, session.ErrInvalid)
	}
	return nil
}

// causeBy says what happened and who did it: "paused by cli".
func causeBy(ctx context.Context, what string) string {
	if who := session.Actor(ctx); who != "" {
		return what + " by " + who
	}
	return what
}

// bootLocked makes s running on a new (fake) VM.
func (f *Fake) bootLocked(ctx context.Context, s *fakeSession, cause string) {
	f.pidSeq++
	s.info.Pid = 4000 + f.pidSeq
	s.info.Accel = "tcg"
	s.info.StartedAt = f.now()
	f.setStateLocked(ctx, s, session.StateRunning, cause)
}

func (f *Fake) setStateLocked(ctx context.Context, s *fakeSession, st session.State, cause string) {
	s.info.State = st
	s.info.Cause = cause
	if st != session.StateRunning {
		s.info.Live = nil // only running sessions are sampled
	}
	if st == session.StateStopped || st == session.StateCrashed || st == session.StateSleeping {
		s.info.Pid = 0
		s.info.Accel = ""
		s.info.MemUsedBytes = 0
	}
	f.publishLocked(ctx, s, session.Event{Kind: session.EventState, Message: cause})
}

// invalidState says why verb cannot be done to s in its current state and
// what to do instead, as the service does.
func invalidState(verb session.Action, s *fakeSession) error {
	if err := session.CheckTransition(s.info.Name, verb, s.info.State); err != nil {
		return err
	}
	return fmt.Errorf("cannot %s session %q now: %w", verb, s.info.Name, session.ErrInvalidState)
}

// usableLocked checks that s can run commands and file operations, waking
// it when it sleeps.
func (f *Fake) usableLocked(ctx context.Context, name string, verb session.Action) (*fakeSession, error) {
	s, err := f.getLocked(name)
	if err != nil {
		return nil, err
	}
	switch s.info.State {
	case session.StateRunning:
	case session.StateSleeping:
		f.bootLocked(ctx, s, causeBy(ctx, "woken"))
	default:
		return nil, invalidState(verb, s)
	}
	s.info.LastActivity = f.now()
	return s, nil
}

// Pause stops a running session's vCPUs. It does not flush.
func (f *Fake) Pause(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Pause", name, func(s *fakeSession) error {
		if s.info.State != session.StateRunning {
			return invalidState("pause", s)
		}
		f.setStateLocked(ctx, s, session.StatePaused, causeBy(ctx, "paused"))
		return nil
	})
}

// Resume continues a paused session, or wakes a sleeping one.
func (f *Fake) Resume(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Resume", name, func(s *fakeSession) error {
		switch s.info.State {
		case session.StatePaused:
			f.setStateLocked(ctx, s, session.StateRunning, causeBy(ctx, "resumed"))
		case session.StateSleeping:
			f.bootLocked(ctx, s, causeBy(ctx, "woken"))
		default:
			return invalidState("resume", s)
		}
		return nil
	})
}

// Start boots a new VM for a stopped, crashed or sleeping session.
func (f *Fake) Start(ctx context.Context, name string) (session.Session, error) {
	return f.transition(ctx, "Start", name, func(s *fakeSession) error {
		switch s.info.State {
		case session.StateStopped, session.StateCrashed, session.StateSleeping:
			f.bootLocked(ctx, s, causeBy(ctx, "started"))
		default:
			return invalidState("start", s)
		}
		return nil
	})
}

// transition begins a call of method and runs do on the session under the
// lock.
func (f *Fake) transition(ctx context.Context, method, name string, do func(*fakeSession) error) (session.Session, error) {
	s, err := f.enterSession(ctx, method, name)
	if err != nil {
		return session.Session{}, err
	}
	defer f.mu.Unlock()
	if err := do(s); err != nil {
		return session.Session{}, err
	}
	return s.info, nil
}

// Stop ends the session's commands (they end cancelled), flushes and powers
// the VM off.
func (f *Fake) Stop(ctx context.Context, name string) (session.Session, error) {
	if err := f.enter(ctx, "Stop"); err != nil {
		return session.Session{}, err
	}
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return session.Session{}, err
	}
	switch s.info.State {
	case session.StateRunning, session.StatePaused, session.StateSleeping, session.StateCrashed:
	default:
		f.mu.Unlock()
		return session.Session{}, invalidState("stop", s)
	}
	f.setStateLocked(ctx, s, session.StateStopping, causeBy(ctx, "stopping"))
	running := f.endExecsLocked(s, errStopped)
	f.mu.Unlock()

	waitExecs(running)

	f.mu.Lock()
	defer f.mu.Unlock()
	s.info.DirtyBytes = 0
	f.setStateLocked(ctx, s, session.StateStopped, causeBy(ctx, "stopped"))
	return s.info, nil
}

// Delete removes the session, its commands' records and its files.
func (f *Fake) Delete(ctx context.Context, name string) error {
	if err := f.enter(ctx, "Delete"); err != nil {
		return err
	}
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return err
	}
	if s.info.State == session.StateCreating || s.info.State == session.StateStopping {
		f.mu.Unlock()
		return invalidState("delete", s)
	}
	f.setStateLocked(ctx, s, session.StateDeleting, causeBy(ctx, "deleting"))
	running := f.endExecsLocked(s, errDeleted)
	f.mu.Unlock()

	waitExecs(running)

	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range s.execs {
		delete(f.execs, e.rec.ID)
	}
	delete(f.sessions, name)
	f.publishLocked(ctx, s, session.Event{Kind: session.EventDeleted, Message: causeBy(ctx, "deleted")})
	return nil
}

// Flush makes pending writes durable. A sleeping session is woken first;
// paused and stopped sessions refuse.
func (f *Fake) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	if err := f.enter(ctx, "Flush"); err != nil {
		return session.FlushResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.usableLocked(ctx, name, "flush")
	if err != nil {
		return session.FlushResult{}, err
	}
	res := session.FlushResult{DirtyBefore: s.info.DirtyBytes, Took: f.opts.FlushTook}
	s.info.DirtyBytes = 0
	now := f.now()
	f.publishLocked(ctx, s, session.Event{Time: now, Kind: session.EventFlush, Message: fmt.Sprintf("flushed %d bytes", res.DirtyBefore)})
	// The figures changed: a real guest's next stats refresh says so.
	f.publishLocked(ctx, s, session.Event{Time: now, Kind: session.EventStats})
	return res, nil
}

// SetDirty sets the bytes a crash of the session's VM would lose now, as
// the live figures from a guest would, and publishes a stats event.
func (f *Fake) SetDirty(name string, n int64) error {
	return f.Update(name, func(s *session.Session) { s.DirtyBytes = n })
}

// Crash simulates the session's VM dying: the session becomes crashed and
// its running commands end as lost.
func (f *Fake) Crash(name, cause string) error {
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return err
	}
	s.info.DirtyBytes = 0
	f.setStateLocked(context.Background(), s, session.StateCrashed, cause)
	running := f.endExecsLocked(s, errLost)
	f.mu.Unlock()
	waitExecs(running)
	return nil
}

// Sleep simulates idle sleep: a running session with no running command
// releases its VM; the next use wakes it.
func (f *Fake) Sleep(ctx context.Context, name string) (session.Session, error) {
	s, err := f.enterSession(ctx, "Sleep", name)
	if err != nil {
		return session.Session{}, err
	}
	defer f.mu.Unlock()
	if s.info.State != session.StateRunning {
		return session.Session{}, invalidState(session.ActionSleep, s)
	}
	if n := s.info.Running; n > 0 {
		return session.Session{}, fmt.Errorf("cannot sleep session %q: %d command(s) still running: %w", name, n, session.ErrInvalidState)
	}
	f.setStateLocked(ctx, s, session.StateSleeping, "idle")
	return s.info, nil
}

// Replace gives the session a new (fake) VM on its retained workspace: its
// commands end as a stop ends them, its system changes (SystemUsed) are
// dropped, and it runs again. opts.Image must be one the fake knows
// (Options.Images) or the session's own; "" keeps the session's.
func (f *Fake) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	if err := f.enter(ctx, "Replace"); err != nil {
		return session.ReplaceResult{}, err
	}
	f.mu.Lock()
	s, err := f.getLocked(name)
	if err != nil {
		f.mu.Unlock()
		return session.ReplaceResult{}, err
	}
	if !session.Allowed(session.ActionReplace, s.info.State) {
		f.mu.Unlock()
		return session.ReplaceResult{}, invalidState(session.ActionReplace, s)
	}
	image := opts.Image
	if image == "" {
		image = s.info.Image
	}
	if image != s.info.Image && !slices.Contains(f.opts.Images, image) {
		f.mu.Unlock()
		return session.ReplaceResult{}, &session.Error{Class: session.ErrNotFound, Field: session.FieldImage, Msg: fmt.Sprintf("%q is not built", image), Hint: "build it from a recipe, or list the images there are"}
	}
	res := session.ReplaceResult{Dropped: s.info.SystemUsed, From: imageRef(s.info.Image, s.info.ImageDigest)}
	f.setStateLocked(ctx, s, session.StateStopping, causeBy(ctx, "replacing the VM"))
	running := f.endExecsLocked(s, errStopped)
	f.mu.Unlock()

	waitExecs(running)

	f.mu.Lock()
	defer f.mu.Unlock()
	s.info.DirtyBytes = 0
	if image != s.info.Image {
		s.info.ImageDigest = ""
	}
	s.info.Image, s.info.SystemUsed = image, 0
	res.To = imageRef(s.info.Image, s.info.ImageDigest)
	f.setStateLocked(ctx, s, session.StateStopped, causeBy(ctx, "replacing the VM: system disk reset"))
	f.publishLocked(ctx, s, session.Event{Kind: session.EventNote, Message: fmt.Sprintf(
		"replaced the VM: %s of system changes dropped (%s); new system disk from %s; /workspace kept", session.FormatBytes(res.Dropped), res.From, res.To)})
	f.bootLocked(ctx, s, causeBy(ctx, "replaced"))
	res.Session = s.info
	return res, nil
}

// imageRef names a build as Replace reports it: image@digest.
func imageRef(image, digest string) string {
	if digest == "" {
		digest = "-"
	}
	return image + "@" + digest
}
