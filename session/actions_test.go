package session

import (
	"errors"
	"testing"
)

// The action table: every row complete, each action once; reads change
// nothing and every viewer may do them; an unknown action counts as a
// change only an admin may make.
func TestActionTable(t *testing.T) {
	seen := map[Action]bool{}
	for _, v := range Verbs() {
		if seen[v.Action] {
			t.Errorf("%s listed twice", v.Action)
		}
		seen[v.Action] = true
		if v.What == "" || v.Role < Viewer || v.Role > Admin {
			t.Errorf("%s: incomplete row %+v", v.Action, v)
		}
		if !v.Mutates && v.Role != Viewer {
			t.Errorf("%s changes nothing but needs %s", v.Action, v.Role)
		}
	}
	for _, c := range []struct {
		a       Action
		role    Role
		allowed bool
	}{
		{ActionRead, Viewer, true},
		{ActionFiles, Viewer, true},
		{ActionExec, Viewer, false},
		{ActionExec, Operator, true},
		{ActionDelete, Operator, false},
		{ActionDelete, Admin, true},
		{ActionRestore, Operator, false},
		{ActionImage, Operator, false},
		{ActionImageExport, Viewer, true},
		{"no-such-action", Operator, false},
		{"no-such-action", Admin, true},
	} {
		err := Permit(c.role, c.a)
		if (err == nil) != c.allowed || err != nil && !errors.Is(err, ErrPermission) {
			t.Errorf("Permit(%s, %s) = %v, want allowed %v", c.role, c.a, err, c.allowed)
		}
	}
	if Mutates(ActionRead) || !Mutates(ActionPause) || !Mutates("no-such-action") {
		t.Error("Mutates does not follow the table")
	}
	if err := Permit(Operator, ActionDelete); err.Error() != "role operator may not delete sessions (needs admin)" {
		t.Errorf("refusal reads %q", err)
	}
}
