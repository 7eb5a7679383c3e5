package session

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidateName checks a session name: lower-case letters, digits and
// dashes, starting with a letter or digit, at most 63 characters (it is
// used in paths and as an SSH user name).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid session name %q: use 1-63 of a-z, 0-9 and '-', starting with a letter or digit: %w", name, ErrInvalid)
	}
	return nil
}

// transitions lists, per action, the states it is allowed from.
var transitions = map[string][]State{
	"pause":  {StateRunning},
	"resume": {StatePaused, StateSleeping},
	"stop":   {StateRunning, StatePaused, StateCrashed, StateSleeping},
	"start":  {StateStopped, StateCrashed, StateSleeping},
	"delete": {StateRunning, StatePaused, StateStopped, StateCrashed, StateSleeping},
	"flush":  {StateRunning, StateSleeping},
	"exec":   {StateRunning, StateSleeping},
	"files":  {StateRunning, StateSleeping},
	"sleep":  {StateRunning},
}

// hints say what to do when an action is refused in a state.
var hints = map[State]string{
	StatePaused:   "resume it first",
	StateStopped:  "start it first",
	StateCrashed:  "start it to boot a new VM on its workspace",
	StateCreating: "wait for it to finish creating",
	StateStopping: "wait for it to stop",
	StateDeleting: "it is being deleted",
	StateRunning:  "it is already running",
}

// checkTransition returns a wrapped ErrInvalidState when action is not
// allowed in state.
func checkTransition(name, action string, state State) error {
	for _, s := range transitions[action] {
		if s == state {
			return nil
		}
	}
	hint := hints[state]
	if hint != "" {
		hint = " (" + hint + ")"
	}
	return fmt.Errorf("cannot %s session %q: it is %s%s: %w", action, name, state, hint, ErrInvalidState)
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?$`)

// ParseSize reads 512M, 4G, 1.5G, 1024K, 4GiB or plain bytes. Units are
// binary (K = 1024).
func ParseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("want a number with an optional K, M, G or T suffix, like 512M or 1.5G")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("want a number with an optional K, M, G or T suffix, like 512M or 1.5G")
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
