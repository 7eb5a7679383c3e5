package session

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The rules every front end (CLI, TUI, SSH server) and fake shares live
// here, each defined once: session names, state transitions and sizes.
// Front ends call them; where they check early (the CLI refusing a bad name
// before it connects) they call the same function the service does.

// isName reports whether s is 1-63 of a-z, 0-9 and '-', starting with a
// letter or digit: the form of session and image names. (A loop, not a
// regular expression: every berth command links this package, and one
// compiled at init is start-up time every command pays.)
func isName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ReservedName is no session's name: over SSH, berth@HOST is the
// workbench while NAME@HOST is session NAME.
const ReservedName = "berth"

// A NameError is a refused session name. It wraps ErrInvalid; its message
// says what a name may contain.
type NameError struct{ Name string }

func (e *NameError) Error() string {
	if e.Name == ReservedName {
		return fmt.Sprintf("the session name %q is reserved: over SSH, berth@HOST is the workbench and NAME@HOST a session", e.Name)
	}
	return fmt.Sprintf("invalid session name %q: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit", e.Name)
}

func (e *NameError) Unwrap() error { return ErrInvalid }

// ValidateName checks a session name: lower-case letters, digits and
// dashes, starting with a letter or digit, at most 63 characters (it is
// used in paths and as an SSH user name). It returns a *NameError.
func ValidateName(name string) error {
	if !isName(name) || name == ReservedName {
		return &NameError{Name: name}
	}
	return nil
}

// hints say what to do when an action is refused in a state.
var hints = map[State]string{
	StatePaused:   "resume it first",
	StateStopped:  "start it first",
	StateCrashed:  "start it to boot a new VM on its workspace",
	StateCreating: "wait for it to finish creating",
	StateStopping: "wait for it to stop",
	StateDeleting: "it is being deleted",
}

// leadsTo is the state an action brings a session to. Refused because the
// session is in it already, the action is no mistake to fix but nothing
// to do, and the message says so instead of a hint about the state.
var leadsTo = map[Action]State{
	ActionPause:  StatePaused,
	ActionResume: StateRunning,
	ActionStop:   StateStopped,
	ActionStart:  StateRunning,
	ActionSleep:  StateSleeping,
}

// Allowed reports whether the action table allows action in state: an
// action without states is allowed in every one, and one the table does
// not list in none.
func Allowed(action Action, state State) bool {
	v, ok := Lookup(action)
	if !ok {
		return false
	}
	return v.States == nil || slices.Contains(v.States, state)
}

// CheckTransition returns nil when action is allowed in state, else an
// error wrapping ErrInvalidState that names the session and the state and
// says what to do: `cannot pause session "a": it is stopped (start it
// first)`. The service returns it; front ends show it as it is.
func CheckTransition(name string, action Action, state State) error {
	return CheckTransitionHint(name, action, state, hints[state])
}

// CheckTransitionHint is CheckTransition with the hint given: a session that
// paused itself says why.
func CheckTransitionHint(name string, action Action, state State, hint string) error {
	if Allowed(action, state) {
		return nil
	}
	if to, ok := leadsTo[action]; ok && to == state {
		return fmt.Errorf("cannot %s session %q: it is already %s: %w", action, name, state, ErrInvalidState)
	}
	if hint != "" {
		hint = " (" + hint + ")"
	}
	verb := string(action)
	if v, ok := Lookup(action); ok && v.Refusal != "" {
		verb = v.Refusal
	}
	return fmt.Errorf("cannot %s session %q: it is %s%s: %w", verb, name, state, hint, ErrInvalidState)
}

// MaxCPUs bounds a session's virtual CPUs.
const MaxCPUs = 64

// CheckCPUs refuses a number of virtual CPUs outside 1 to MaxCPUs. Zero is
// refused too: a front end that means "the default" leaves the field out
// rather than passing 0 through this check.
func CheckCPUs(n int) error {
	if n < 1 || n > MaxCPUs {
		return Invalid(FieldCPUs, fmt.Sprintf("%d: use 1 to %d", n, MaxCPUs), "")
	}
	return nil
}

// sizeRE is compiled on first use (see isName).
var sizeRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?$`) })

const sizeWant = "want a number with an optional K, M, G or T suffix, like 512M or 1.5G"

// ParseSize reads a size in bytes: 512M, 4G, 1.5G, 1024K, 4GiB, 2t. Units
// are binary (1K = 1024) and case does not matter. A bare number is bytes,
// everywhere sizes are read (flags, the TUI, the config file). The size
// must be a whole number of bytes above zero.
func ParseSize(s string) (int64, error) {
	m := sizeRE().FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%s", sizeWant)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%s", sizeWant)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m[2]]
	bytes := v * float64(uint64(1)<<shift)
	switch {
	case bytes != math.Trunc(bytes):
		return 0, fmt.Errorf("%s is not a whole number of bytes", s)
	case bytes > 1<<62:
		return 0, fmt.Errorf("%s is too large", s)
	case bytes <= 0:
		return 0, fmt.Errorf("want a size above zero")
	}
	return int64(bytes), nil
}

// ParseMemory reads a guest memory size as ParseSize does and returns it
// in MiB; it must be a whole number of MiB. A bare number is bytes, as
// everywhere, so "512" is refused with a hint to write 512M.
func ParseMemory(s string) (mib int, err error) {
	n, err := ParseSize(s)
	if err != nil {
		return 0, err
	}
	if n%(1<<20) != 0 {
		t := strings.TrimSpace(s)
		if _, err := strconv.ParseUint(t, 10, 64); err == nil {
			return 0, fmt.Errorf("%s means %s bytes; want a whole number of MiB (did you mean %sM?)", t, t, t)
		}
		return 0, fmt.Errorf("%s is %d bytes; want a whole number of MiB, like 512M", t, n)
	}
	return int(n >> 20), nil
}
