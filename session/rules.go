package session

import (
	"fmt"
	"strings"
	"time"
)

// The smallest resources a session may have.
const (
	MinMemoryMiB   = 128      // what a guest needs to boot
	MinDiskBytes   = 16 << 20 // a workspace holds a filesystem
	MinSystemBytes = 64 << 20 // a system disk over an image's layers
	// MaxCPUsPerHostCPU bounds a session's vCPUs by the host's CPUs.
	MaxCPUsPerHostCPU = 4
	// MaxLabel bounds a checkpoint's label.
	MaxLabel = 200
)

// Limits are the host's side of a create's rules; a zero field is not
// known and not checked (the fake knows no host).
type Limits struct {
	HostCPUs     int   // the host's CPUs
	MemAvailable int64 // bytes of memory the host has available
	DiskFree     int64 // bytes free under DataDir
	DataDir      string
}

// ValidateCreate checks a create whose defaults are filled in: the name,
// its resources against the minimums and the host, its idle timeout and
// its network policy ("": DefaultNet), which it returns in its normal
// form. Every refusal
// is an *Error naming the field at fault.
func ValidateCreate(opts CreateOptions, lim Limits) (policy string, err error) {
	if err := ValidateName(opts.Name); err != nil {
		return "", err
	}
	if err := CheckCPUs(opts.CPUs); err != nil {
		return "", err
	}
	if lim.HostCPUs > 0 && opts.CPUs > lim.HostCPUs*MaxCPUsPerHostCPU {
		return "", Invalid(FieldCPUs, fmt.Sprintf("%d is more than %dx this host's %d CPUs", opts.CPUs, MaxCPUsPerHostCPU, lim.HostCPUs), "")
	}
	if opts.MemoryMiB < MinMemoryMiB {
		return "", Invalid(FieldMemory, fmt.Sprintf("%dM is below the %dM a guest needs", opts.MemoryMiB, MinMemoryMiB), "")
	}
	if lim.MemAvailable > 0 && int64(opts.MemoryMiB)<<20 > lim.MemAvailable {
		return "", Invalid(FieldMemory, fmt.Sprintf("%dM exceeds the host's available memory (%dM)", opts.MemoryMiB, lim.MemAvailable>>20), "")
	}
	if opts.DiskBytes < MinDiskBytes {
		return "", Invalid(FieldDisk, fmt.Sprintf("%s is below the %s minimum", FormatBytes(opts.DiskBytes), FormatBytes(MinDiskBytes)), "")
	}
	if lim.DiskFree > 0 && opts.DiskBytes > lim.DiskFree {
		return "", Invalid(FieldDisk, fmt.Sprintf("%s exceeds the free space under %s (%s)", FormatBytes(opts.DiskBytes), lim.DataDir, FormatBytes(lim.DiskFree)), "")
	}
	if opts.SystemBytes != 0 && opts.SystemBytes < MinSystemBytes {
		return "", Invalid(FieldSystemDisk, fmt.Sprintf("%s is below the %s minimum", FormatBytes(opts.SystemBytes), FormatBytes(MinSystemBytes)), "")
	}
	if opts.IdleTimeout != nil && *opts.IdleTimeout < 0 {
		return "", Invalid(FieldIdleTimeout, fmt.Sprintf("%s: want 0 (never) or a positive duration", *opts.IdleTimeout), "")
	}
	if opts.Net == "" {
		opts.Net = DefaultNet
	}
	p, err := ParsePolicy(opts.Net)
	if err != nil {
		return "", &Error{Class: ErrInvalid, Field: FieldNet, Msg: strings.TrimSuffix(err.Error(), ": "+ErrInvalid.Error()), Err: err}
	}
	return p.String(), nil
}

// ValidateLabel checks a checkpoint's label: one line, at most MaxLabel
// bytes.
func ValidateLabel(label string) error {
	if len(label) > MaxLabel || strings.ContainsAny(label, "\n\r\x00") {
		return Invalid(FieldLabel, fmt.Sprintf("must be one line of at most %d characters", MaxLabel), "")
	}
	return nil
}

// CheckpointState is what a checkpoint's preconditions look at.
type CheckpointState struct {
	Name  string
	State State
	// Count and Bytes are the session's checkpoints now; Estimate what
	// the new one would take at most.
	Count           int
	Bytes, Estimate int64
	// Limit and LimitBytes are the configured bounds (checkpoint_limit,
	// checkpoint_bytes).
	Limit      int
	LimitBytes int64
}

// CheckCheckpoint checks a checkpoint request against the session's state
// and its checkpoints' limits: the transition, the label, a memory
// snapshot only of a running or sleeping session, and room under both
// limits.
func CheckCheckpoint(opts CheckpointOptions, c CheckpointState) error {
	if err := ValidateLabel(opts.Label); err != nil {
		return err
	}
	if err := CheckTransition(c.Name, ActionCheckpoint, c.State); err != nil {
		return err
	}
	if opts.Memory && c.State != StateRunning && c.State != StateSleeping {
		return &Error{Class: ErrInvalidState, Field: FieldKeepMemory,
			Msg:  fmt.Sprintf("needs a running or sleeping session; session %q is %s", c.Name, c.State),
			Hint: "checkpoint its disks alone"}
	}
	hint := fmt.Sprintf("remove one of session %s's checkpoints first", c.Name)
	if c.Limit > 0 && c.Count >= c.Limit {
		return &Error{Class: ErrConflict, Field: FieldCheckpoint,
			Msg:  fmt.Sprintf("limit reached: session %q has %d checkpoints, the limit (checkpoint_limit in config.toml)", c.Name, c.Count),
			Hint: hint}
	}
	if c.LimitBytes > 0 && c.Bytes+c.Estimate > c.LimitBytes {
		return &Error{Class: ErrConflict, Field: FieldCheckpoint,
			Msg: fmt.Sprintf("of session %q would take up to %s; its %d checkpoints hold %s of the %s limit (checkpoint_bytes in config.toml)",
				c.Name, FormatBytes(c.Estimate), c.Count, FormatBytes(c.Bytes), FormatBytes(c.LimitBytes)),
			Hint: hint}
	}
	return nil
}

// NoCheckpoint is the refusal of a checkpoint id a session does not have.
func NoCheckpoint(name, id string) error {
	return &Error{Class: ErrNotFound, Field: FieldCheckpoint,
		Msg:  fmt.Sprintf("%q: session %q has no such checkpoint", id, name),
		Hint: "list its checkpoints to see their ids"}
}

// WithDefaults returns o with its zero fields (resources, image, VMM,
// system disk, policy) taken from d: what a create gets when it leaves
// them out.
func (o CreateOptions) WithDefaults(d CreateOptions) CreateOptions {
	if o.CPUs == 0 {
		o.CPUs = d.CPUs
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = d.MemoryMiB
	}
	if o.DiskBytes == 0 {
		o.DiskBytes = d.DiskBytes
	}
	if o.Image == "" {
		o.Image = d.Image
	}
	if o.VMM == "" {
		o.VMM = d.VMM
	}
	if o.SystemBytes == 0 {
		o.SystemBytes = d.SystemBytes
	}
	if o.Net == "" {
		o.Net = d.Net
	}
	if o.IdleTimeout == nil {
		o.IdleTimeout = d.IdleTimeout
	}
	return o
}

// DefaultCreate is what a create gets where neither it nor the config
// file says: the Default constants.
func DefaultCreate() CreateOptions {
	return CreateOptions{CPUs: DefaultCPUs, MemoryMiB: DefaultMemoryMiB, DiskBytes: DefaultDiskBytes,
		Image: DefaultImage, VMM: DefaultVMM, SystemBytes: DefaultSystemBytes, Net: DefaultNet}
}

// CheckpointRef names a checkpoint by the session it was taken of: ID
// "" is that session's newest.
type CheckpointRef struct {
	Session string
	ID      string
}

// String writes r as ParseCheckpointRef reads it: NAME@ID, or NAME.
func (r CheckpointRef) String() string {
	if r.ID == "" {
		return r.Session
	}
	return r.Session + "@" + r.ID
}

// maxCheckpointID bounds the id in a reference: ids are short ("c12").
const maxCheckpointID = 32

// ParseCheckpointRef reads "NAME@ID" (checkpoint ID of session NAME) or
// "NAME" (its newest). The name follows ValidateName; an id is 1 to 32
// lowercase letters, digits and dashes. A refusal points at FieldFrom.
func ParseCheckpointRef(s string) (CheckpointRef, error) {
	name, id, hasID := strings.Cut(s, "@")
	shown := s
	if len(shown) > 80 {
		shown = shown[:80] + "…"
	}
	if err := ValidateName(name); err != nil {
		msg := fmt.Sprintf("%q: want NAME@ID or NAME, with NAME a session's name", shown)
		if name == "" {
			msg = fmt.Sprintf("%q: want NAME@ID (a checkpoint of session NAME) or NAME (its newest checkpoint)", shown)
		}
		return CheckpointRef{}, &Error{Class: ErrInvalid, Field: FieldFrom, Msg: msg, Err: err}
	}
	if hasID {
		ok := id != "" && len(id) <= maxCheckpointID
		for _, c := range id {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				ok = false
			}
		}
		if !ok {
			return CheckpointRef{}, Invalid(FieldFrom, fmt.Sprintf("%q: the checkpoint id after @ is empty or malformed", shown), "list the session's checkpoints to see their ids")
		}
	}
	return CheckpointRef{Session: name, ID: id}, nil
}

// CheckCreateFrom checks a create from a checkpoint (opts.From set) as
// asked, before defaults: the name, the reference, and nothing chosen
// that the checkpoint decides (its image and its disks, which are
// copied).
func CheckCreateFrom(opts CreateOptions) (CheckpointRef, error) {
	if err := ValidateName(opts.Name); err != nil {
		return CheckpointRef{}, err
	}
	ref, err := ParseCheckpointRef(opts.From)
	if err != nil {
		return ref, err
	}
	const hint = "leave it out"
	switch {
	case opts.Image != "":
		return ref, Invalid(FieldImage, fmt.Sprintf("%q cannot be chosen for a session made from a checkpoint: it runs on the checkpoint's image", opts.Image), hint)
	case opts.DiskBytes != 0:
		return ref, Invalid(FieldDisk, "cannot be chosen for a session made from a checkpoint: its workspace is a copy of the checkpoint's", hint)
	case opts.SystemBytes != 0:
		return ref, Invalid(FieldSystemDisk, "cannot be chosen for a session made from a checkpoint: its system disk is a copy of the checkpoint's", hint)
	}
	return ref, nil
}

// NoSourceSession is the refusal of a create from a checkpoint of a
// session that does not exist.
func NoSourceSession(ref CheckpointRef) error {
	return &Error{Class: ErrNotFound, Field: FieldFrom,
		Msg:  fmt.Sprintf("%s: there is no session %q to take a checkpoint of", ref, ref.Session),
		Hint: "list the sessions to see their names"}
}

// PickCheckpoint finds the checkpoint ref names in list (its session's,
// oldest first): its ID, or with none the newest.
func PickCheckpoint(ref CheckpointRef, list []Checkpoint) (Checkpoint, error) {
	if ref.ID == "" {
		if len(list) == 0 {
			return Checkpoint{}, &Error{Class: ErrNotFound, Field: FieldFrom,
				Msg:  fmt.Sprintf("%s: session %q has no checkpoints", ref, ref.Session),
				Hint: "take one of it first"}
		}
		return list[len(list)-1], nil
	}
	for _, c := range list {
		if c.ID == ref.ID {
			return c, nil
		}
	}
	return Checkpoint{}, &Error{Class: ErrNotFound, Field: FieldFrom,
		Msg:  fmt.Sprintf("%s: session %q has no checkpoint %q", ref, ref.Session, ref.ID),
		Hint: "list its checkpoints to see their ids"}
}

// SourceImageGone is the refusal of a create from a checkpoint whose
// image (the build its system disk was made on) no longer exists.
func SourceImageGone(ref CheckpointRef, ck Checkpoint, image, digest string, cause error) error {
	build := image
	if digest != "" {
		build += "@" + digest
	}
	return &Error{Class: ErrNotFound, Field: FieldFrom,
		Msg:  fmt.Sprintf("%s: checkpoint %s runs on image %s, which is gone", ref, ck.ID, build),
		Hint: "a checkpoint of a session on an existing image can be used", Err: cause}
}

// CreateSource is what a create from a checkpoint takes from it and from
// the session it was taken of.
type CreateSource struct {
	Checkpoint Checkpoint
	// The VM the checkpoint was taken of: a memory checkpoint resumes on
	// one of this size and hypervisor.
	CPUs      int
	MemoryMiB int
	VMM       string
	// The source session's settings, which the new one keeps unless the
	// create says otherwise.
	Net         string
	IdleTimeout *time.Duration
}

// FromSource completes a create from a checkpoint (checked by
// CheckCreateFrom) with what it leaves out, taken from src, and applies
// the create rules to the result. A memory checkpoint resumes a VM as it
// was, so its size and hypervisor cannot change. The disks are copies,
// whose room the copy asks for: the host's free space is not held
// against their size here (as a fork's is not). The returned options
// carry the network policy in its normal form.
func (o CreateOptions) FromSource(src CreateSource, lim Limits) (CreateOptions, error) {
	if src.Checkpoint.Memory {
		hint := fmt.Sprintf("leave it out: memory checkpoint %s resumes its VM as it was", src.Checkpoint.ID)
		switch {
		case o.CPUs != 0 && o.CPUs != src.CPUs:
			return o, Invalid(FieldCPUs, fmt.Sprintf("%d differs from the %d of the VM in the checkpoint", o.CPUs, src.CPUs), hint)
		case o.MemoryMiB != 0 && o.MemoryMiB != src.MemoryMiB:
			return o, Invalid(FieldMemory, fmt.Sprintf("%dM differs from the %dM of the VM in the checkpoint", o.MemoryMiB, src.MemoryMiB), hint)
		case o.VMM != "" && o.VMM != src.VMM:
			return o, Invalid(FieldVMM, fmt.Sprintf("%q differs from the %s the checkpoint's VM ran on", o.VMM, src.VMM), hint)
		}
	}
	o = o.WithDefaults(CreateOptions{CPUs: src.CPUs, MemoryMiB: src.MemoryMiB, VMM: src.VMM, Net: src.Net, IdleTimeout: src.IdleTimeout})
	v := o
	v.DiskBytes, v.SystemBytes, lim.DiskFree = MinDiskBytes, 0, 0
	net, err := ValidateCreate(v, lim)
	if err != nil {
		return o, err
	}
	o.Net = net
	return o, nil
}

// MaxUser bounds a command's user (ExecRequest.User).
const MaxUser = 256

// ValidateUser checks the form of a command's user: NAME or UID, with an
// optional :GROUP or :GID, at most MaxUser bytes, no spaces or control
// characters. Whether the guest has that user is the guest's to say.
func ValidateUser(spec string) error {
	const want = "want NAME or UID, with an optional :GROUP or :GID"
	if spec == "" || len(spec) > MaxUser {
		return Invalid(FieldUser, fmt.Sprintf("must be 1 to %d characters: %s", MaxUser, want), "")
	}
	shown := spec
	if len(shown) > 64 {
		shown = shown[:64] + "…"
	}
	for _, c := range spec {
		if c <= ' ' || c == 0x7f {
			return Invalid(FieldUser, fmt.Sprintf("%q has a space or a control character: %s", shown, want), "")
		}
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	if user == "" || hasGroup && (group == "" || strings.Contains(group, ":")) {
		return Invalid(FieldUser, fmt.Sprintf("%q: %s", shown, want), "")
	}
	return nil
}
