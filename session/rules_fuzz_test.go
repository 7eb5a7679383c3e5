package session

import (
	"strings"
	"testing"
)

// FuzzParseCheckpointRef: a create's from field (client input) parses or
// is refused on field from, and what parses writes back as it was read.
func FuzzParseCheckpointRef(f *testing.F) {
	for _, s := range []string{"src@c1", "src", "", "@", "src@", "a@b@c", "Src@c1", "src@../c1", "berth@c1", "x@" + strings.Repeat("c", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ref, err := ParseCheckpointRef(s)
		if err != nil {
			if FieldOf(err) != FieldFrom {
				t.Errorf("ParseCheckpointRef(%q): %v, not on field from", s, err)
			}
			return
		}
		if ref.String() != s || ValidateName(ref.Session) != nil || len(ref.ID) > maxCheckpointID || strings.ContainsAny(ref.ID, "/.@") {
			t.Errorf("ParseCheckpointRef(%q) = %+v", s, ref)
		}
	})
}

// FuzzValidateUser: a command's user (client input) is refused on field
// user, or is one line of at most MaxUser bytes with one user part and
// at most one group part.
func FuzzValidateUser(f *testing.F) {
	for _, s := range []string{"root", "app:staff", "1000:1000", "", "a:", ":b", "a:b:c", "a b", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateUser(s); err != nil {
			if FieldOf(err) != FieldUser {
				t.Errorf("ValidateUser(%q): %v, not on field user", s, err)
			}
			return
		}
		if len(s) > MaxUser || strings.ContainsAny(s, " \n\r\t\x00") || strings.Count(s, ":") > 1 || strings.HasPrefix(s, ":") || strings.HasSuffix(s, ":") {
			t.Errorf("ValidateUser(%q) accepted it", s)
		}
	})
}
