// Package users resolves a user named as a container image's config or a
// command's --user names it — NAME or UID, with an optional :GROUP or
// :GID — against a root's /etc/passwd and /etc/group, as runc does: a
// name must be in passwd, a uid need not be (it then runs with gid 0 and
// home /), a group name must be in group, and the groups that list the
// user as a member are its supplementary groups.
//
// The files are the guest's (or an image's), so untrusted: callers read
// at most MaxFile bytes of each, and every line and field is bounded.
package users

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

const (
	// MaxSpec bounds a user spec.
	MaxSpec = 256
	// MaxFile is what callers read of /etc/passwd and of /etc/group at
	// most; what is past it is not looked at.
	MaxFile = 1 << 20
	// MaxGroups bounds the supplementary groups.
	MaxGroups = 64
)

// User is a resolved user.
type User struct {
	Name   string // "" for a uid passwd does not list
	UID    int
	GID    int
	Groups []int // supplementary groups, without GID
	Home   string
}

// UnknownError is a name the files do not have.
type UnknownError struct {
	Kind string // "user" or "group"
	Name string
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("%s %q is not in /etc/%s", e.Kind, e.Name, e.File())
}

// File is the file under /etc that does not have the name.
func (e *UnknownError) File() string {
	if e.Kind == "group" {
		return "group"
	}
	return "passwd"
}

// ParseSpec splits spec into its user and group parts (group "" when it
// names none) and checks its form: at most MaxSpec bytes, printable, no
// spaces, both parts non-empty where given.
func ParseSpec(spec string) (user, group string, err error) {
	if spec == "" || len(spec) > MaxSpec {
		return "", "", fmt.Errorf("a user is 1 to %d characters: NAME or UID, with an optional :GROUP or :GID", MaxSpec)
	}
	for _, c := range spec {
		if c <= ' ' || c == 0x7f {
			return "", "", fmt.Errorf("user %q: no spaces or control characters", clip(spec))
		}
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	if user == "" || hasGroup && (group == "" || strings.Contains(group, ":")) {
		return "", "", fmt.Errorf("user %q: want NAME or UID, with an optional :GROUP or :GID", clip(spec))
	}
	return user, group, nil
}

// ParseID reads a uid or gid: a decimal number below 2^32-1 (which is
// -1, "no id", to the kernel).
func ParseID(s string) (int, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, fmt.Errorf("bad id %q", clip(s))
	}
	return int(n), nil
}

// Lookup resolves spec against the contents of /etc/passwd and
// /etc/group (nil when the root has none). root is root even where
// passwd does not list it.
func Lookup(spec string, passwd, group []byte) (User, error) {
	name, grp, err := ParseSpec(spec)
	if err != nil {
		return User{}, err
	}
	u := User{UID: -1, Home: "/"}
	if n, err := ParseID(name); err == nil {
		u.UID = n
	}
	for _, f := range lines(passwd, 7) {
		uid, err1 := ParseID(f[2])
		gid, err2 := ParseID(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		if f[0] == name || u.UID >= 0 && uid == u.UID {
			u.Name, u.UID, u.GID, u.Home = f[0], uid, gid, f[5]
			break
		}
	}
	if u.UID < 0 {
		if name != "root" {
			return User{}, &UnknownError{Kind: "user", Name: clip(name)}
		}
		u = User{Name: "root", UID: 0, GID: 0, Home: "/root"}
	}
	if u.Home == "" {
		u.Home = "/"
	}
	groups := lines(group, 3)
	if grp != "" {
		if n, err := ParseID(grp); err == nil {
			u.GID = n
		} else {
			found := false
			for _, f := range groups {
				if gid, err := ParseID(f[2]); err == nil && f[0] == grp {
					u.GID, found = gid, true
					break
				}
			}
			if !found {
				return User{}, &UnknownError{Kind: "group", Name: clip(grp)}
			}
		}
	}
	if u.Name != "" {
		for _, f := range groups {
			gid, err := ParseID(f[2])
			if err != nil || len(f) < 4 || gid == u.GID || slices.Contains(u.Groups, gid) || len(u.Groups) >= MaxGroups {
				continue
			}
			for m := range strings.SplitSeq(f[3], ",") {
				if strings.TrimSpace(m) == u.Name {
					u.Groups = append(u.Groups, gid)
					break
				}
			}
		}
	}
	return u, nil
}

// lines splits a passwd-style file into the colon-separated fields of
// each line with at least n fields; comments and short lines are skipped.
func lines(b []byte, n int) [][]string {
	if len(b) > MaxFile {
		b = b[:MaxFile]
	}
	var out [][]string
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		s := strings.TrimSuffix(string(l), "\r")
		if s == "" || s[0] == '#' {
			continue
		}
		f := strings.Split(s, ":")
		if len(f) >= n {
			out = append(out, f)
		}
	}
	return out
}

// clip bounds a name quoted in a message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
