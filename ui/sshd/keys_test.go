package sshd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

func TestParseAuthorizedKeys(t *testing.T) {
	a := newKey(t, "alice@laptop", Admin)
	b := newKey(t, "", Operator)
	c := newKey(t, "carol", Viewer)
	bare := func(k testKey) string { return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k.pub()))) }
	file := strings.Join([]string{
		"# comment",
		"",
		a.line(),
		`berth-role="operator" ` + bare(b),
		bare(c) + " carol",
		`berth-role="root" ` + bare(c),
		`from="10.0.0.0/8" ` + bare(c),
		`no-port-forwarding,no-agent-forwarding,berth-role="viewer" ` + bare(newKey(t, "", Viewer)) + " dave",
		`restrict ` + bare(c),
		"ssh-ed25519 notbase64",
		a.line(),
		"  " + bare(newKey(t, "", Viewer)) + " eve  \r",
	}, "\n")
	keys, problems := ParseAuthorizedKeys([]byte(file))
	type want struct {
		role    Role
		comment string
		line    int
	}
	wants := []want{{Admin, "alice@laptop", 3}, {Operator, "", 4}, {Viewer, "carol", 5}, {Viewer, "dave", 8}, {Viewer, "eve", 12}}
	if len(keys) != len(wants) {
		t.Fatalf("%d keys, want %d: %+v (problems %q)", len(keys), len(wants), keys, problems)
	}
	for i, w := range wants {
		k := keys[i]
		if k.Role != w.role || k.Comment != w.comment || k.Line != w.line || k.Fingerprint != gossh.FingerprintSHA256(k.Key) {
			t.Errorf("key %d = %+v, want %+v", i, k, w)
		}
	}
	if keys[1].Name() != b.fingerprint() || keys[1].Actor() != "ssh:"+b.fingerprint() {
		t.Errorf("a key without comment is named %q", keys[1].Name())
	}
	wantProblems := []string{"line 6: berth-role=\"root\"", "line 7: option from is not supported", "line 9: option restrict is not supported", "line 10: not a public key", "line 11: key " + a.fingerprint() + " is already listed on line 3"}
	if len(problems) != len(wantProblems) {
		t.Fatalf("problems %q", problems)
	}
	for i, w := range wantProblems {
		if !strings.HasPrefix(problems[i], w) {
			t.Errorf("problem %d = %q, want it to start %q", i, problems[i], w)
		}
	}
}

func TestAddKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh")
	a := newKey(t, "alice@laptop", Operator)
	pub := gossh.MarshalAuthorizedKey(a.pub())
	pub = append(pub[:len(pub)-1], " alice@laptop\n"...)
	ak, err := AddKey(dir, pub, Operator)
	if err != nil {
		t.Fatal(err)
	}
	if ak.Role != Operator || ak.Comment != "alice@laptop" || ak.Fingerprint != a.fingerprint() {
		t.Errorf("added %+v", ak)
	}
	path := filepath.Join(dir, AuthorizedKeysFile)
	for p, mode := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %o", p, fi.Mode(), err, mode)
		}
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), "# berth SSH access") || !strings.HasSuffix(string(b), a.line()+"\n") {
		t.Errorf("file:\n%s", b)
	}
	keys, problems := ParseAuthorizedKeys(b)
	if len(keys) != 1 || len(problems) != 0 || keys[0].Line != ak.Line {
		t.Errorf("parsed back %+v %q (AddKey said line %d)", keys, problems, ak.Line)
	}

	// Appending to a file whose last line has no newline.
	os.WriteFile(path, append(b, "# trailing"...), 0o600)
	c := newKey(t, "carol", Viewer)
	ak, err = AddKey(dir, gossh.MarshalAuthorizedKey(c.pub()), Admin)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	keys, _ = ParseAuthorizedKeys(b)
	if len(keys) != 2 || keys[1].Role != Admin || keys[1].Line != ak.Line {
		t.Errorf("after a second add: %+v (AddKey said line %d)\n%s", keys, ak.Line, b)
	}

	if _, err := AddKey(dir, pub, Admin); !errors.Is(err, session.ErrExists) || !strings.Contains(err.Error(), "role operator") {
		t.Errorf("adding a listed key: %v", err)
	}
	for name, in := range map[string]string{
		"private key":  "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n",
		"garbage":      "hello",
		"with options": `command="ls" ` + string(gossh.MarshalAuthorizedKey(newKey(t, "", Viewer).pub())),
	} {
		if _, err := AddKey(dir, []byte(in), Viewer); !errors.Is(err, session.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if b2, _ := os.ReadFile(path); string(b2) != string(b) {
		t.Error("refused keys changed the file")
	}
}

// TestKeyringReload: edits apply at the next lookup, however quick.
func TestKeyringReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, AuthorizedKeysFile)
	kr := newKeyring(path, testLogger(t))
	a := newKey(t, "a", Viewer)
	if _, err := kr.lookup(a.pub()); !errors.Is(err, session.ErrPermission) {
		t.Errorf("lookup without a file: %v", err)
	}
	os.WriteFile(path, []byte(a.line()+"\n"), 0o600)
	if ak, err := kr.lookup(a.pub()); err != nil || ak.Role != Viewer {
		t.Errorf("after adding: %+v %v", ak, err)
	}
	a.role = Admin // same size as "viewer"? no: rewrite in place, quickly
	os.WriteFile(path, []byte(a.line()+"\n"), 0o600)
	if ak, err := kr.lookup(a.pub()); err != nil || ak.Role != Admin {
		t.Errorf("after a role change: %+v %v", ak, err)
	}
	// An edit that keeps size and mtime (restored) is caught by content
	// while the file is recent.
	b, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `"admin"`, `"viewr"`, 1)), 0o600)
	os.Chtimes(path, fi.ModTime(), fi.ModTime())
	if _, err := kr.lookup(a.pub()); err == nil {
		t.Error("a same-size, same-mtime edit was missed")
	}
	// Old files are not re-read without a stat change.
	old := time.Now().Add(-time.Hour)
	os.WriteFile(path, []byte(a.line()+"\n"), 0o600)
	os.Chtimes(path, old, old)
	if _, err := kr.lookup(a.pub()); err != nil {
		t.Fatal(err)
	}
	if n := kr.count(); n != 1 {
		t.Errorf("count = %d", n)
	}
	os.Remove(path)
	if _, err := kr.lookup(a.pub()); !errors.Is(err, session.ErrPermission) {
		t.Errorf("after removing the file: %v", err)
	}
}

func TestLoadHostKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh")
	s1, created, err := LoadHostKey(dir)
	if err != nil || !created || s1.PublicKey().Type() != gossh.KeyAlgoED25519 {
		t.Fatalf("first load: %v %v", created, err)
	}
	path := filepath.Join(dir, HostKeyFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("host key mode %v %v", fi.Mode(), err)
	}
	pub, _ := os.ReadFile(path + ".pub")
	if string(pub) != string(gossh.MarshalAuthorizedKey(s1.PublicKey())) {
		t.Errorf(".pub = %q", pub)
	}
	s2, created, err := LoadHostKey(dir)
	if err != nil || created || gossh.FingerprintSHA256(s2.PublicKey()) != gossh.FingerprintSHA256(s1.PublicKey()) {
		t.Errorf("second load: created %v, %v, same key %v", created, err, gossh.FingerprintSHA256(s2.PublicKey()) == gossh.FingerprintSHA256(s1.PublicKey()))
	}
	os.Chmod(path, 0o644)
	if _, _, err := LoadHostKey(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a readable host key: %v", err)
	}
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("junk"), 0o600)
	if _, _, err := LoadHostKey(dir); err == nil || !strings.Contains(err.Error(), "move it away") {
		t.Errorf("a broken host key: %v", err)
	}
}

func TestNewPrintsFingerprint(t *testing.T) {
	var out strings.Builder
	k := newKey(t, "a", Admin)
	w := newWorld(t, worldOpts{opts: Options{Out: &out}}, k)
	w.stop()
	fp := gossh.FingerprintSHA256(w.srv.HostKey())
	if !strings.Contains(out.String(), "host key "+fp+" (ssh-ed25519)") || !strings.Contains(out.String(), "1 authorized key(s)") {
		t.Errorf("startup lines: %q", out.String())
	}
}

func TestCRLFWriter(t *testing.T) {
	var b strings.Builder
	w := crlfWriter{&b}
	for _, s := range []string{"a\nb", "\r\n", "c\n", "no newline"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Errorf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if b.String() != "a\r\nb\r\nc\r\nno newline" {
		t.Errorf("%q", b.String())
	}
}
