package session

import (
	"errors"
	"fmt"
	"strings"
)

// ErrUnsupported is the class of a call this side of the contract does not
// do: a front end talking to a daemon without images, a fake without
// handles. It says so instead of failing in some other way.
var ErrUnsupported = errors.New("not supported here")

// The fields an Error can point at: the arguments of the Service's calls,
// by a name of the contract's own. Each front end renders them its way
// (the CLI as its flag, the TUI as its form's label, MCP as its tool's
// argument).
const (
	FieldName        = "name"
	FieldCPUs        = "cpus"
	FieldMemory      = "memory"
	FieldDisk        = "disk"
	FieldSystemDisk  = "system_disk"
	FieldIdleTimeout = "idle_timeout"
	FieldNet         = "net"
	FieldImage       = "image"
	FieldLabel       = "label"
	FieldKeepMemory  = "memory_snapshot" // a checkpoint's (CheckpointOptions.Memory)
	FieldCheckpoint  = "checkpoint"
	FieldPath        = "path"
	FieldSpec        = "spec"
	FieldCommand     = "command"
	FieldRun         = "run"
	FieldSource      = "source" // an image import's source
	FieldRef         = "ref"    // the image picked from an import's source
	FieldFrom        = "from"   // a create's checkpoint (CreateOptions.From)
	FieldVMM         = "vmm"
	FieldUser        = "user"      // who a command runs as (ExecRequest.User)
	FieldSession     = "session"   // the session an image call names (a commit's)
	FieldNewImage    = "new_image" // the image a commit makes
)

// Codes say more than a class where a client acts on it: an errno's name
// ("ENOENT", "EEXIST") for file operations, or one of these.
const (
	// CodeEscape is a path that leads out of /workspace.
	CodeEscape = "escape"
	// CodeNoStart is a run that kept no starting point to diff or undo:
	// a front end says how it starts runs that keep one.
	CodeNoStart = "no-start"
	// CodeInUse is an image that sessions or images built on it
	// (committed, or recipes on it) still use; the message names them.
	CodeInUse = "in-use"
	// CodeNoSystemDisk is a session whose image has no root filesystem
	// (its root is its initramfs), so there is no system disk to commit.
	CodeNoSystemDisk = "no-system-disk"
	// CodeLayers is an image with as many layers as a VM stacks, on
	// which a commit cannot put another.
	CodeLayers = "layers"
)

// Error is a refusal or a failure with its structure kept: the class, the
// field at fault, a code, the message and what to do. The socket API
// carries every part, so a client far from the engine renders it as well
// as one in-process.
type Error struct {
	Class error  // one of the Err classes, or nil
	Field string // the argument at fault, or ""
	Code  string // an errno name or a Code constant, or ""
	// Msg says what is wrong, without naming the field: the renderer
	// puts the field's own name before it.
	Msg string
	// Hint says what to do, in words every front end can show; it names
	// no command line flag.
	Hint string
	// Err is the cause (in-process only; across the socket the class,
	// code and text travel).
	Err error
}

// Error renders the error with its fields as the contract names them.
func (e *Error) Error() string { return e.Render(nil) }

// Render renders the error with label naming its field (nil: the
// contract's name in words, "system disk" for system_disk): "memory 64M
// is below the 128M a guest needs".
func (e *Error) Render(label func(field string) string) string {
	var b strings.Builder
	if e.Field != "" {
		f := strings.ReplaceAll(e.Field, "_", " ")
		if label != nil {
			f = label(e.Field)
		}
		b.WriteString(f)
		b.WriteString(" ")
	}
	b.WriteString(e.Msg)
	if e.Hint != "" {
		b.WriteString(" (")
		b.WriteString(e.Hint)
		b.WriteString(")")
	}
	return b.String()
}

func (e *Error) Unwrap() []error {
	var out []error
	if e.Class != nil {
		out = append(out, e.Class)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// Is matches another *Error by class, field and code: a test or a front
// end can ask errors.Is(err, &Error{Field: FieldMemory}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return (t.Class == nil || t.Class == e.Class) && (t.Field == "" || t.Field == e.Field) && (t.Code == "" || t.Code == e.Code)
}

// Invalid is an ErrInvalid refusal of field.
func Invalid(field, msg, hint string) *Error {
	return &Error{Class: ErrInvalid, Field: field, Msg: msg, Hint: hint}
}

// FieldOf returns the field err points at, or "".
func FieldOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Field
	}
	return ""
}

// CodeOf returns err's code, or "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Render renders err whole with label naming the field of the *Error in
// it, keeping whatever context wraps it: the CLI's "--memory 64M is below
// …", the TUI's "Memory: …". Errors without one render as they are.
func Render(err error, label func(field string) string) string {
	if err == nil {
		return ""
	}
	full := err.Error()
	var e *Error
	if label == nil || !errors.As(err, &e) || e.Field == "" {
		return full
	}
	own := e.Error()
	if !strings.Contains(full, own) {
		return full
	}
	return strings.Replace(full, own, e.Render(label), 1)
}

// OutsideWorkspace is the refusal of path p, which leads out of
// /workspace: every side refuses such a path with it, by its code.
func OutsideWorkspace(p string) *Error {
	return &Error{Class: ErrInvalid, Code: CodeEscape, Msg: fmt.Sprintf("path %q is outside /workspace", p)}
}

// EndNotRecordedNote begins the Error of an execution whose end was
// reported before the store could keep it (a full disk): the end is
// true, but a daemon crash before berth stores it leaves the record lost.
const EndNotRecordedNote = "its end is not recorded yet"

// EndNotRecorded is that Error, with the store's refusal.
func EndNotRecorded(err error) string {
	return fmt.Sprintf("%s (%v): berth keeps trying as the disk frees; a daemon crash before then leaves its record lost", EndNotRecordedNote, err)
}
