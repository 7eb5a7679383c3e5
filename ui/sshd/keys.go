package sshd

import (
	"bytes"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// AuthorizedKeysFile and HostKeyFile are the file names in the SSH
// directory (<data>/ssh).
const (
	AuthorizedKeysFile = "authorized_keys"
	HostKeyFile        = "host_ed25519"
)

// racyWindow is how long after a change authorized_keys is re-read on
// every lookup, whatever its stat says.
const racyWindow = 2 * time.Second

// roleOption is the authorized_keys option that carries a key's role.
const roleOption = "berth-role"

// authorizedKeysHeader starts a new authorized_keys file; it documents the
// format for whoever opens it.
const authorizedKeysHeader = `# berth SSH access, in OpenSSH authorized_keys syntax. berth re-reads this
# file at every login and action: no restart is needed.
#
# One public key per line, optionally preceded by berth's role option:
#
#   berth-role="operator" ssh-ed25519 AAAAC3Nza... alice@laptop
#
# Roles: viewer (read everything, change nothing), operator (create, pause,
# resume, stop, start, sleep, flush, exec, shell, change files; no delete),
# admin (everything). A line without berth-role is a viewer. The comment (or
# the key's SHA256 fingerprint) names the key in berth's records:
# "ssh:alice@laptop". Deleting a line revokes the key; its open connections
# are closed within seconds. Other OpenSSH options (from=, command=,
# restrict, ...) are not supported: a line using them is ignored, so access
# is never wider than written. This file must not be writable by others.
#
# Add keys with: berth ssh add-key [--role viewer|operator|admin] KEYFILE
`

// harmlessOption reports OpenSSH options that only forbid what berth never
// offers (forwarding, X11, user rc), so they are accepted and ignored.
func harmlessOption(name string) bool {
	switch strings.ToLower(name) {
	case "no-port-forwarding", "no-agent-forwarding", "no-x11-forwarding", "no-user-rc":
		return true
	}
	return false
}

// AuthorizedKey is one usable line of authorized_keys.
type AuthorizedKey struct {
	Key         gossh.PublicKey
	Role        Role
	Comment     string // as written, "" if none
	Fingerprint string // "SHA256:..."
	Line        int
}

// Name is how the key appears in records and logs: its comment, or its
// fingerprint when it has none.
func (k AuthorizedKey) Name() string {
	if c := cleanComment(k.Comment); c != "" {
		return c
	}
	return k.Fingerprint
}

// Actor is the key's name in session records: "ssh:alice@laptop".
func (k AuthorizedKey) Actor() string { return "ssh:" + k.Name() }

// cleanComment keeps a key comment printable and short: it ends up in
// records, logs and the TUI footer.
func cleanComment(c string) string {
	c = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.TrimSpace(c))
	if r := []rune(c); len(r) > 64 {
		c = string(r[:64])
	}
	return c
}

// ParseAuthorizedKeys parses an authorized_keys file's content. Lines that
// cannot be used (not a key, an unknown role, an unsupported option, a
// certificate, a duplicate) are skipped and reported in problems, one
// "line N: ..." each; the first line of a duplicated key wins, as in OpenSSH.
func ParseAuthorizedKeys(b []byte) (keys []AuthorizedKey, problems []string) {
	seen := map[string]int{}
	for i, line := range bytes.Split(b, []byte("\n")) {
		n := i + 1
		line = bytes.TrimSpace(bytes.TrimSuffix(line, []byte("\r")))
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		pub, comment, options, _, err := gossh.ParseAuthorizedKey(line)
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: not a public key (%v)", n, err))
			continue
		}
		if _, ok := pub.(*gossh.Certificate); ok {
			problems = append(problems, fmt.Sprintf("line %d: certificates are not supported; list the plain public key", n))
			continue
		}
		role, err := roleFromOptions(options)
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v; the key is ignored", n, err))
			continue
		}
		k := AuthorizedKey{Key: pub, Role: role, Comment: comment, Fingerprint: gossh.FingerprintSHA256(pub), Line: n}
		if first, dup := seen[string(pub.Marshal())]; dup {
			problems = append(problems, fmt.Sprintf("line %d: key %s is already listed on line %d, which is the one used", n, k.Fingerprint, first))
			continue
		}
		seen[string(pub.Marshal())] = n
		keys = append(keys, k)
	}
	return keys, problems
}

// roleFromOptions reads berth-role from a line's options; other options
// must be harmless.
func roleFromOptions(options []string) (Role, error) {
	role := Viewer
	found := false
	for _, o := range options {
		name, val, hasVal := strings.Cut(o, "=")
		switch {
		case strings.EqualFold(name, roleOption) && hasVal:
			if found {
				return 0, fmt.Errorf("%s is given twice", roleOption)
			}
			found = true
			r, err := ParseRole(strings.Trim(val, `"`))
			if err != nil {
				return 0, fmt.Errorf("%s=%s: use viewer, operator or admin", roleOption, val)
			}
			role = r
		case !hasVal && harmlessOption(name):
		default:
			return 0, fmt.Errorf("option %s is not supported by berth", name)
		}
	}
	return role, nil
}

// FormatAuthorizedKey returns the authorized_keys line for key with role.
func FormatAuthorizedKey(key gossh.PublicKey, role Role, comment string) string {
	line := fmt.Sprintf("%s=%q %s", roleOption, role.String(), strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key))))
	if c := cleanComment(comment); c != "" {
		line += " " + c
	}
	return line
}

// AddKey appends pubKey (an OpenSSH public key line, as in id_ed25519.pub)
// with role to dir's authorized_keys, creating dir (0700) and the file
// (0600, with a header documenting the format) if needed. A key that is
// already listed is refused with session.ErrExists: its line says its role.
func AddKey(dir string, pubKey []byte, role Role) (AuthorizedKey, error) {
	if role < Viewer || role > Admin {
		return AuthorizedKey{}, fmt.Errorf("add key: %v: %w", role, session.ErrInvalid)
	}
	in := bytes.TrimSpace(pubKey)
	if bytes.Contains(in, []byte("PRIVATE KEY")) {
		return AuthorizedKey{}, fmt.Errorf("that is a private key: pass the public key (the .pub file): %w", session.ErrInvalid)
	}
	pub, comment, options, _, err := gossh.ParseAuthorizedKey(in)
	if err != nil {
		return AuthorizedKey{}, fmt.Errorf("not an OpenSSH public key (want a line like 'ssh-ed25519 AAAA... you@host'): %w", session.ErrInvalid)
	}
	if len(options) > 0 {
		return AuthorizedKey{}, fmt.Errorf("the key line has options (%s): pass the bare public key and choose the role with --role: %w", strings.Join(options, ","), session.ErrInvalid)
	}
	if _, ok := pub.(*gossh.Certificate); ok {
		return AuthorizedKey{}, fmt.Errorf("certificates are not supported; pass the plain public key: %w", session.ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: %w", err)
	}
	path := filepath.Join(dir, AuthorizedKeysFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: %w", err)
	}
	defer f.Close()
	old, err := readAll(f)
	if err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: reading %s: %w", path, err)
	}
	keys, _ := ParseAuthorizedKeys(old)
	for _, k := range keys {
		if bytes.Equal(k.Key.Marshal(), pub.Marshal()) {
			return k, fmt.Errorf("key %s is already in %s (line %d, role %s); edit that line to change its role: %w",
				k.Fingerprint, path, k.Line, k.Role, session.ErrExists)
		}
	}
	var add bytes.Buffer
	if len(bytes.TrimSpace(old)) == 0 {
		add.WriteString(authorizedKeysHeader)
	} else if old[len(old)-1] != '\n' {
		add.WriteByte('\n')
	}
	line := FormatAuthorizedKey(pub, role, comment)
	add.WriteString(line + "\n")
	if _, err := f.WriteAt(add.Bytes(), int64(len(old))); err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: syncing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return AuthorizedKey{}, fmt.Errorf("add key: %w", err)
	}
	n := bytes.Count(old, []byte("\n")) + bytes.Count(add.Bytes(), []byte("\n")) // the file ends with ours
	return AuthorizedKey{Key: pub, Role: role, Comment: comment, Fingerprint: gossh.FingerprintSHA256(pub), Line: n}, nil
}

func readAll(f *os.File) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(f)
	return buf.Bytes(), err
}

// keyring is authorized_keys as of its last change: each lookup stats the
// file and re-reads it when its size, mtime or inode changed, so edits
// (and removals) apply at the next authentication or action.
type keyring struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex
	stamp   fileStamp
	keys    map[string]AuthorizedKey // by marshalled public key
	content []byte                   // what keys were parsed from
	loaded  bool
	status  string // why no key is usable, "" when some are
}

type fileStamp struct {
	ok    bool
	size  int64
	mtime int64
	ino   uint64
	dev   uint64
	mode  fs.FileMode
}

func newKeyring(path string, log *slog.Logger) *keyring {
	return &keyring{path: path, log: log}
}

// lookup returns key's current entry, or an error wrapping
// session.ErrPermission when it is not (or no longer) authorized.
func (k *keyring) lookup(key gossh.PublicKey) (AuthorizedKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refreshLocked()
	if ak, ok := k.keys[string(key.Marshal())]; ok {
		return ak, nil
	}
	return AuthorizedKey{}, fmt.Errorf("key %s is not in %s (add it with 'berth ssh add-key'): %w",
		gossh.FingerprintSHA256(key), k.path, session.ErrPermission)
}

// refreshLocked re-reads the file when it changed since the last read,
// and rebuilds the keys when its content did.
func (k *keyring) refreshLocked() {
	st := statFile(k.path)
	// A file changed within the timestamp granularity of its last read
	// could look unchanged: re-read while its mtime is recent.
	if k.loaded && st == k.stamp && time.Since(time.Unix(0, st.mtime)) > racyWindow {
		return
	}
	k.stamp = st
	var b []byte
	status := ""
	switch {
	case !st.ok:
		status = "the file does not exist; add a key with 'berth ssh add-key KEYFILE'"
	case st.mode&0o022 != 0:
		status = fmt.Sprintf("the file is writable by others (mode %04o); run chmod go-w %s", st.mode.Perm(), k.path)
	default:
		var err error
		if b, err = os.ReadFile(k.path); err != nil {
			status = err.Error()
		}
	}
	if k.loaded && status == k.status && bytes.Equal(b, k.content) {
		return
	}
	k.loaded, k.content = true, b
	k.keys = map[string]AuthorizedKey{}
	if status == "" {
		keys, problems := ParseAuthorizedKeys(b)
		for _, p := range problems {
			k.log.Warn("ssh: authorized_keys "+p, "file", k.path)
		}
		for _, ak := range keys {
			k.keys[string(ak.Key.Marshal())] = ak
		}
		if len(keys) == 0 {
			status = "the file lists no usable key"
		} else {
			k.log.Info("ssh: loaded authorized keys", "file", k.path, "keys", len(keys))
		}
	}
	if status != "" && status != k.status {
		k.log.Warn("ssh: no key can log in", "file", k.path, "reason", status)
	}
	k.status = status
}

// statFile returns what tells one version of path from another.
func statFile(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	st := fileStamp{ok: true, size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino, st.dev = sys.Ino, uint64(sys.Dev)
	}
	return st
}

// count returns how many keys can log in now.
func (k *keyring) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refreshLocked()
	return len(k.keys)
}
