package users

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

const passwd = `root:x:0:0:root:/root:/bin/sh
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
app:x:1000:1001:App:/home/app:/bin/sh
nohome:x:1002:1002:::/bin/sh
short:x:1003
bad:x:notanumber:1:x:/x:/bin/sh
`

const group = `root:x:0:
app:x:1001:
staff:x:50:app,other
wheel:x:10:other, app
nomembers:x:60
`

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		spec   string
		passwd string
		want   User
		err    string
	}{
		{"app", passwd, User{Name: "app", UID: 1000, GID: 1001, Groups: []int{50, 10}, Home: "/home/app"}, ""},
		{"1000", passwd, User{Name: "app", UID: 1000, GID: 1001, Groups: []int{50, 10}, Home: "/home/app"}, ""},
		{"app:staff", passwd, User{Name: "app", UID: 1000, GID: 50, Groups: []int{10}, Home: "/home/app"}, ""},
		{"app:7", passwd, User{Name: "app", UID: 1000, GID: 7, Groups: []int{50, 10}, Home: "/home/app"}, ""},
		{"root", passwd, User{Name: "root", UID: 0, GID: 0, Home: "/root"}, ""},
		{"0:0", passwd, User{Name: "root", UID: 0, GID: 0, Home: "/root"}, ""},
		{"root", "", User{Name: "root", UID: 0, GID: 0, Home: "/root"}, ""}, // no passwd: root is still root
		{"4242", passwd, User{UID: 4242, GID: 0, Home: "/"}, ""},            // a uid passwd does not list
		{"4242:4243", passwd, User{UID: 4242, GID: 4243, Home: "/"}, ""},
		{"nohome", passwd, User{Name: "nohome", UID: 1002, GID: 1002, Home: "/"}, ""},
		{"nobody", passwd, User{}, `user "nobody" is not in /etc/passwd`},
		{"short", passwd, User{}, `user "short" is not in /etc/passwd`},
		{"bad", passwd, User{}, `user "bad" is not in /etc/passwd`},
		{"app:nogroup", passwd, User{}, `group "nogroup" is not in /etc/group`},
		{"", passwd, User{}, "1 to 256 characters"},
		{"app:", passwd, User{}, "want NAME or UID"},
		{":staff", passwd, User{}, "want NAME or UID"},
		{"a:b:c", passwd, User{}, "want NAME or UID"},
		{"a b", passwd, User{}, "no spaces"},
		{"4294967295", passwd, User{}, `user "4294967295" is not in /etc/passwd`}, // -1 is no uid
		{strings.Repeat("a", MaxSpec+1), passwd, User{}, "1 to 256 characters"},
	} {
		got, err := Lookup(c.spec, []byte(c.passwd), []byte(group))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Lookup(%q) = %+v, %v; want an error saying %q", c.spec, got, err, c.err)
			}
			continue
		}
		if err != nil || got.Name != c.want.Name || got.UID != c.want.UID || got.GID != c.want.GID || got.Home != c.want.Home || !slices.Equal(got.Groups, c.want.Groups) {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	var unknown *UnknownError
	if _, err := Lookup("ghost", []byte(passwd), nil); !errors.As(err, &unknown) || unknown.Kind != "user" || unknown.Name != "ghost" {
		t.Errorf("an unknown user: %v, want an *UnknownError", err)
	}
}

// FuzzLookup: any spec and files resolve or fail without panicking, and a
// resolved user has ids the kernel takes, a home, and supplementary
// groups bounded and apart from its group.
func FuzzLookup(f *testing.F) {
	f.Add("app", passwd, group)
	f.Add("1000:staff", passwd, group)
	f.Add("root", "", "")
	f.Add("app:", "app:x:1:2:::\n", "g:x:3:app,app\n")
	f.Add("x", "x:x:4294967295:0:::\nx:x:5:5:x:/h:/s\r\n", "")
	f.Fuzz(func(t *testing.T, spec, pw, gr string) {
		u, err := Lookup(spec, []byte(pw), []byte(gr))
		if err != nil {
			return
		}
		if u.UID < 0 || u.UID >= 1<<32-1 || u.GID < 0 || u.GID >= 1<<32-1 || u.Home == "" || len(u.Groups) > MaxGroups || slices.Contains(u.Groups, u.GID) {
			t.Errorf("Lookup(%q) = %+v", spec, u)
		}
		if again, err := Lookup(spec, []byte(pw), []byte(gr)); err != nil || again.UID != u.UID || again.GID != u.GID || !slices.Equal(again.Groups, u.Groups) {
			t.Errorf("Lookup(%q) is not deterministic: %+v then %+v, %v", spec, u, again, err)
		}
	})
}
