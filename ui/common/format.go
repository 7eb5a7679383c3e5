package common

import (
	"errors"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// Ago formats how long ago t was, relative to now (session.FormatAgo):
// "now", "12s ago", "3m ago". The zero time is "—".
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return session.FormatAgo(now.Sub(t))
}

// WorkspaceUsed is a session's workspace use for a cell, as last
// measured, or "?" when it was never measured (rather than 0 B).
func WorkspaceUsed(s session.Session) string {
	if !s.WorkspaceKnown() {
		return "?"
	}
	return session.FormatBytesShort(s.WorkspaceUsed)
}

// ErrorText renders an error for the status line: one line, bounded, and
// prefixed with a plain-words hint for the error classes an operator can
// act on; a refused transition is shown as the service words it. The full error goes to the log, not the screen.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	msg := SanitizeLine(session.Render(err, FieldLabel))
	if errors.Is(err, session.ErrInvalidState) {
		// A refusal says "cannot ... (what to do)"; the class adds nothing.
		msg = strings.TrimSuffix(msg, ": "+session.ErrInvalidState.Error())
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	switch {
	case errors.Is(err, session.ErrPermission):
		return "not allowed: " + msg
	case errors.Is(err, session.ErrUnavailable):
		return "unavailable: " + msg
	}
	return msg
}

// FieldLabel names a field of the contract's errors as the TUI's forms
// label it.
func FieldLabel(field string) string {
	switch field {
	case session.FieldCPUs:
		return "vCPUs"
	case session.FieldMemory:
		return "Memory"
	case session.FieldDisk:
		return "Disk"
	case session.FieldSystemDisk:
		return "System disk"
	case session.FieldIdleTimeout:
		return "Idle timeout"
	case session.FieldNet:
		return "Network policy"
	case session.FieldImage:
		return "Image"
	case session.FieldLabel:
		return "Label"
	case session.FieldKeepMemory:
		return "Memory snapshot"
	case session.FieldCheckpoint:
		return "Checkpoint"
	case session.FieldFrom:
		return "From"
	case session.FieldVMM:
		return "VMM"
	case session.FieldName:
		return "Name"
	case session.FieldPath:
		return "Path"
	case session.FieldSpec:
		return "Schedule"
	case session.FieldCommand:
		return "Command"
	}
	return field
}

// ExecLabel is a short human label for an execution: its command line,
// or "shell" for an outside process without argv.
func ExecLabel(e session.Execution) string {
	if len(e.Argv) == 0 {
		if e.Outside {
			return "(outside process)"
		}
		return "(no command)"
	}
	// sh -c 'cmd' is how the TUI runs commands; show the command itself.
	if len(e.Argv) == 3 && (e.Argv[0] == "/bin/sh" || e.Argv[0] == "sh") && e.Argv[1] == "-c" {
		return SanitizeLine(e.Argv[2])
	}
	return SanitizeLine(strings.Join(e.Argv, " "))
}

// ShortID shortens an execution id for tables.
func ShortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
