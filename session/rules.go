package session

import (
	"fmt"
	"strings"
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
