package session

import (
	"errors"
	"testing"
)

func TestTransitions(t *testing.T) {
	all := []State{StateCreating, StateRunning, StatePaused, StateStopping, StateStopped, StateCrashed, StateDeleting, StateSleeping}
	allowed := map[Action][]State{
		"pause":  {StateRunning},
		"resume": {StatePaused, StateSleeping},
		"stop":   {StateRunning, StatePaused, StateCrashed, StateSleeping},
		"start":  {StateStopped, StateCrashed, StateSleeping},
		"flush":  {StateRunning, StateSleeping},
		"exec":   {StateRunning, StateSleeping},
		"files":  {StateRunning, StateSleeping},
		"sleep":  {StateRunning},
		"bogus":  {},
		"delete": {StateRunning, StatePaused, StateStopped, StateCrashed, StateSleeping},
	}
	for action, ok := range allowed {
		for _, st := range all {
			err := CheckTransition("a", action, st)
			want := false
			for _, s := range ok {
				want = want || s == st
			}
			if Allowed(action, st) != want {
				t.Errorf("Allowed(%s, %s) = %v, want %v", action, st, !want, want)
			}
			if want && err != nil {
				t.Errorf("%s from %s: %v, want allowed", action, st, err)
			}
			if !want && !errors.Is(err, ErrInvalidState) {
				t.Errorf("%s from %s: %v, want ErrInvalidState", action, st, err)
			}
		}
	}
	err := CheckTransition("alpha", ActionPause, StateStopped)
	if got := err.Error(); got != `cannot pause session "alpha": it is stopped (start it first): invalid state` {
		t.Errorf("message %q", got)
	}
}

func TestValidateName(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "alpha-2": true, "0x": true, "": false, "-a": false, "A": false, "a_b": false,
		"a/b": false, "a.b": false, string(make([]byte, 64)): false,
		"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij123": true,
	} {
		if err := ValidateName(name); (err == nil) != ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "4G": 4 << 30, "1.5G": 3 << 29, "1024K": 1 << 20, "4GiB": 4 << 30, "100": 100, "2t": 2 << 40,
		"10G": 10 << 30, "1.5GiB": 3 << 29, "2048": 2048} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "4Q", "-1G", "0", "1.5", "1e9", "lots"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}
