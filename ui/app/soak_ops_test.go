package app_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthvm/berth/session"
)

// absent stands for "no such file" in a path's set of acceptable digests.
const absent = "-"

// digestSet is what a workspace path may hold: the digests it may have
// (absent for none). Certain knowledge is a set of one; an operation the
// daemon's kill left undecided (was the put acknowledged inside before
// the connection died?) adds its outcome to the old ones.
type digestSet map[string]bool

func one(d string) digestSet { return digestSet{d: true} }

func (s digestSet) clone() digestSet {
	c := make(digestSet, len(s))
	for k := range s {
		c[k] = true
	}
	return c
}

func (s digestSet) String() string {
	var l []string
	for k := range s {
		if len(k) > 12 {
			k = k[:12]
		}
		l = append(l, k)
	}
	slices.Sort(l)
	return "{" + strings.Join(l, " ") + "}"
}

// model is what the soak knows of a session's workspace: paths (files
// and, for cp, trees, whose digest covers every file in them) → the
// digests each may have.
type model map[string]digestSet

func (m model) clone() model {
	c := make(model, len(m))
	for k, v := range m {
		c[k] = v.clone()
	}
	return c
}

// merge is what a path may hold when the soak cannot tell whether the
// workspace became o or stayed m.
func (m model) merge(o model) model {
	c := m.clone()
	for k, v := range o {
		if c[k] == nil {
			c[k] = one(absent)
		}
		for d := range v {
			c[k][d] = true
		}
	}
	for k := range m {
		if o[k] == nil {
			c[k][absent] = true
		}
	}
	return c
}

// set records a path's new content: certain when acknowledged, one more
// possibility when not.
func (m model) set(path, digest string, certain bool) {
	if certain {
		m[path] = one(digest)
		return
	}
	if m[path] == nil {
		m[path] = one(absent)
	}
	m[path][digest] = true
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// treeDigest is a tree's digest: its regular files' relative paths and
// digests, sorted.
func treeDigest(files map[string][]byte) string {
	var lines []string
	for p, b := range files {
		lines = append(lines, p+"\x00"+digest(b))
	}
	slices.Sort(lines)
	return digest([]byte(strings.Join(lines, "\n")))
}

// soakSession is one session's worker state; only its worker touches it
// while the soak runs.
type soakSession struct {
	name string
	rng  *rand.Rand
	n    int // operations so far, for markers and file names

	fwdAddr string // `berth port-forward NAME 0:8080`'s local address
	files   model
	ckpts   map[string]model // checkpoint id → the workspace it holds
	ckOrder []string         // known checkpoints, oldest first
	// policy is what the session's network policy may be.
	policy map[string]bool
	execs  []*execRec
	hist   []string // each operation: when, what, how long, its error
	epoch  int64    // the daemon's epoch when the operation began
}

// execRec is one command the soak ran, how, what it must print, and what
// the client saw.
type execRec struct {
	session, marker, via string // via: api, cli, ssh
	script               string
	wantOut, wantErr     []byte
	wantCode             int  // or nonZero, anyCode
	anyOut, anyErr       bool // the content is not known ahead

	id       string // known at once through the API
	acked    bool   // the daemon took it: an id, output, or an end
	complete bool   // the client saw its end
	gotOut   bytes.Buffer
	gotErr   bytes.Buffer
	gotCode  int
	lastSeq  uint64
	attached bool     // followed again after the daemon's restart
	gaps     []string // chunks that did not follow the one before
}

// Exit codes an execRec may want besides a plain one.
const (
	nonZero = -1
	anyCode = -2
)

// script builds a shell script and, alongside, the output it must print.
type script struct {
	sh        strings.Builder
	out, errb bytes.Buffer
}

func (s *script) echo(line string, toErr bool) {
	if toErr {
		fmt.Fprintf(&s.sh, "echo %s >&2; ", line)
		s.errb.WriteString(line + "\n")
		return
	}
	fmt.Fprintf(&s.sh, "echo %s; ", line)
	s.out.WriteString(line + "\n")
}

func (s *script) seq(n int, toErr bool) {
	redir := ""
	w := &s.out
	if toErr {
		redir, w = " >&2", &s.errb
	}
	fmt.Fprintf(&s.sh, "seq 1 %d%s; ", n, redir)
	for i := 1; i <= n; i++ {
		w.WriteString(strconv.Itoa(i))
		w.WriteByte('\n')
	}
}

func (s *script) loop(tag string, n int) {
	fmt.Fprintf(&s.sh, "i=0; while [ $i -lt %d ]; do echo %s-$i; i=$((i+1)); done; ", n, tag)
	for i := range n {
		fmt.Fprintf(&s.out, "%s-%d\n", tag, i)
	}
}

func (s *script) sleep(sec int) { fmt.Fprintf(&s.sh, "sleep %d; ", sec) }

// words are safe in a shell line unquoted.
var words = []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett"}

// newExec makes a random command with known output, marked so it can be
// found among the session's executions.
func (w *soakWorld) newExec(ss *soakSession, via string) *execRec {
	ss.n++
	r := ss.rng
	marker := fmt.Sprintf("soak-%s-%d", ss.name, ss.n)
	var s script
	fmt.Fprintf(&s.sh, ": %s; ", marker)
	steps := 1 + r.IntN(4)
	for range steps {
		switch k := r.IntN(10); {
		case k < 3:
			s.echo(marker+"-"+words[r.IntN(len(words))], r.IntN(4) == 0)
		case k < 6:
			s.loop(marker, 1+r.IntN(w.cfg.maxLoop))
		case k < 8:
			s.seq(1+r.IntN(w.cfg.maxSeq), r.IntN(5) == 0)
		case k < 9:
			s.sleep(1 + r.IntN(3)) // long enough for a kill to land mid-command
		default:
			if r.IntN(8) == 0 {
				s.seq(w.cfg.maxSeq*4, false) // a big one now and then
			} else {
				s.echo(marker+"-stderr", true)
			}
		}
	}
	code := 0
	if r.IntN(5) == 0 {
		code = 3
		s.sh.WriteString("exit 3")
	} else {
		s.sh.WriteString("exit 0")
	}
	return &execRec{session: ss.name, marker: marker, via: via, script: s.sh.String(),
		wantOut: s.out.Bytes(), wantErr: s.errb.Bytes(), wantCode: code}
}

// fixedExec is a command whose output is given (or, with anyOut, not
// known ahead), marked like newExec's.
func (w *soakWorld) fixedExec(ss *soakSession, body, out string, code int, anyOut bool) *execRec {
	ss.n++
	marker := fmt.Sprintf("soak-%s-%d", ss.name, ss.n)
	return &execRec{session: ss.name, marker: marker, via: "api", script: ": " + marker + "; " + body,
		wantOut: []byte(out), wantCode: code, anyOut: anyOut, anyErr: anyOut}
}

// runAPI runs rec through the socket API and follows its output; when the
// daemon dies under it, it follows again from where it stopped once the
// daemon is back, as a client that wants the whole output does.
func (w *soakWorld) runAPI(ctx context.Context, rec *execRec, reattach bool) error {
	ss := w.byName[rec.session]
	ss.execs = append(ss.execs, rec)
	p, err := w.client.Exec(ctx, rec.session, session.ExecRequest{Argv: []string{"sh", "-c", rec.script}})
	if err != nil {
		return err
	}
	rec.id, rec.acked = p.ID(), true
	for {
		for c := range p.Output() {
			rec.take(c)
		}
		x, err := p.Wait(ctx)
		if err == nil {
			rec.complete, rec.gotCode = true, exitCode(x)
			return nil
		}
		if !reattach || ctx.Err() != nil {
			return err
		}
		// The stream broke: the daemon went away. Follow it again.
		if _, werr := w.d.waitUp(ctx); werr != nil {
			return err
		}
		rec.attached = true
		if p, err = w.client.Attach(ctx, rec.id, rec.lastSeq+1); err != nil {
			return err
		}
	}
}

func (rec *execRec) take(c session.Chunk) {
	if c.Seq != 0 {
		if c.Seq != rec.lastSeq+1 {
			rec.gaps = append(rec.gaps, fmt.Sprintf("chunk %d after %d", c.Seq, rec.lastSeq))
		}
		rec.lastSeq = c.Seq
	}
	switch c.Stream {
	case session.Stdout:
		rec.gotOut.Write(c.Data)
	case session.Stderr:
		rec.gotErr.Write(c.Data)
	}
}

func exitCode(x session.Execution) int {
	if x.State == session.ExecExited && x.ExitCode != nil {
		return *x.ExitCode
	}
	return -1
}

// cli runs the berth command with the gate held shared (see soakDaemon).
// It does not run it when no daemon answers, which would start one.
func (w *soakWorld) cli(ctx context.Context, stdin io.Reader, args ...string) (stdout, stderr []byte, code int, err error) {
	w.d.gate.RLock()
	defer w.d.gate.RUnlock()
	if !w.d.isUp() {
		return nil, nil, 0, errSkipped
	}
	c := exec.CommandContext(ctx, w.berth, append([]string{"--data", w.data, "--cache", w.cache}, args...)...)
	c.Env = w.env
	c.Stdin = stdin
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err = c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.Bytes(), errb.Bytes(), ee.ExitCode(), nil
	}
	return out.Bytes(), errb.Bytes(), 0, err
}

// errSkipped marks an operation not tried (no daemon for a CLI process, a
// session not idle for a sleep).
var errSkipped = errors.New("skipped")

// cliErr turns a failed CLI command into an error carrying its message.
func cliErr(args []string, code int, stderr []byte) error {
	return fmt.Errorf("berth %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(string(stderr)))
}

// endNote is the CLI's line for an end not recorded (session.EndNotRecorded).
var endNote = regexp.MustCompile(`(?m)^berth: x[0-9a-f]+: ` + regexp.QuoteMeta(session.EndNotRecordedNote) + `.*\n`)

func (w *soakWorld) runCLI(ctx context.Context, rec *execRec) error {
	ss := w.byName[rec.session]
	args := []string{"exec", rec.session, "--", "sh", "-c", rec.script}
	out, errb, code, err := w.cli(ctx, nil, args...)
	if errors.Is(err, errSkipped) {
		return err
	}
	ss.execs = append(ss.execs, rec)
	if err != nil {
		return err
	}
	rec.gotOut.Write(out)
	// berth's own line saying a full disk kept the end from the record
	// is the CLI's, not the command's.
	rec.gotErr.Write(endNote.ReplaceAll(errb, nil))
	if code != 0 && code != rec.wantCode {
		return cliErr(args[:2], code, errb)
	}
	rec.acked, rec.complete, rec.gotCode = true, true, code
	return nil
}

func (w *soakWorld) runSSH(ctx context.Context, rec *execRec) error {
	ss := w.byName[rec.session]
	ss.execs = append(ss.execs, rec)
	_, port, _ := net.SplitHostPort(w.sshAddr)
	c := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-i", w.sshKey, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "UserKnownHostsFile="+w.knownHosts, "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30", "-p", port, rec.session+"@127.0.0.1", rec.script)
	c.Stdin = nil
	var errb bytes.Buffer
	c.Stdout, c.Stderr = &rec.gotOut, &errb
	err := c.Run()
	rec.gotErr.Write(errb.Bytes())
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return err
	}
	if rec.gotOut.Len() > 0 {
		rec.acked = true
	}
	// 255 is ssh's own failure; the command's 3 or 0 is its end.
	if code != rec.wantCode && code != 0 {
		return fmt.Errorf("ssh %s: exit %d: %s", rec.session, code, strings.TrimSpace(errb.String()))
	}
	rec.acked, rec.complete, rec.gotCode = true, true, code
	return nil
}

// opFunc is one kind of operation on a session.
type opFunc func(ctx context.Context, w *soakWorld, ss *soakSession) error

type opKind struct {
	name   string
	weight int
	run    opFunc
	// big marks operations that write a lot to the data directory at
	// once (memory snapshots, disk copies): the filler does not fill
	// under them (see soakWorld.bigOps).
	big bool
}

// opKinds is the random mix, with the share of each.
var opKinds = []opKind{
	{"exec-api", 20, opExecAPI, false},
	{"exec-cli", 8, opExecCLI, false},
	{"ssh", 9, opSSH, false},
	{"put-api", 8, opPutAPI, false},
	{"put-cli", 4, opPutCLI, false},
	{"cp-api", 4, opCpAPI, false},
	{"cp-cli", 3, opCpCLI, false},
	{"pause-resume", 7, opPause, false},
	{"sleep-wake", 6, opSleep, true},
	{"checkpoint", 7, opCheckpoint, true},
	{"restore", 5, opRestore, true},
	{"port-forward", 8, opForward, false},
	{"policy", 6, opPolicy, false},
	{"flush", 3, opFlush, false},
	{"stop-start", 2, opStopStart, true},
}

func pickOp(r *rand.Rand) opKind {
	total := 0
	for _, k := range opKinds {
		total += k.weight
	}
	n := r.IntN(total)
	for _, k := range opKinds {
		if n < k.weight {
			return k
		}
		n -= k.weight
	}
	return opKinds[0]
}

func opExecAPI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	return w.runAPI(ctx, w.newExec(ss, "api"), ss.rng.IntN(2) == 0)
}

func opExecCLI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	return w.runCLI(ctx, w.newExec(ss, "cli"))
}

func opSSH(ctx context.Context, w *soakWorld, ss *soakSession) error {
	return w.runSSH(ctx, w.newExec(ss, "ssh"))
}

// content is n bytes of a session's random stream: known, and different
// from every other put.
func content(r *rand.Rand, max int) []byte {
	n := 0
	if r.IntN(8) != 0 {
		n = 1 + r.IntN(max)
	}
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func opPutAPI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	ss.n++
	path := fmt.Sprintf("put/f%d", ss.rng.IntN(6))
	b := content(ss.rng, w.cfg.maxPut)
	_, err := w.client.WriteFile(ctx, ss.name, path, bytes.NewReader(b))
	ss.files.set(path, digest(b), err == nil)
	return err
}

func opPutCLI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	ss.n++
	path := fmt.Sprintf("put/f%d", ss.rng.IntN(6))
	b := content(ss.rng, w.cfg.maxPut)
	local := filepath.Join(w.tmp, fmt.Sprintf("%s-%d", ss.name, ss.n))
	if err := os.WriteFile(local, b, 0o644); err != nil {
		return err
	}
	defer os.Remove(local)
	args := []string{"put", ss.name, local, path}
	_, errb, code, err := w.cli(ctx, nil, args...)
	if errors.Is(err, errSkipped) {
		return err
	}
	if err == nil && code != 0 {
		err = cliErr(args[:2], code, errb)
	}
	ss.files.set(path, digest(b), err == nil)
	return err
}

// tree makes a small directory tree of random files: relative path →
// content.
func tree(r *rand.Rand, max int) map[string][]byte {
	files := map[string][]byte{}
	for i := range 1 + r.IntN(5) {
		dir := ""
		if r.IntN(3) == 0 {
			dir = "sub/"
		}
		files[fmt.Sprintf("%sf%d", dir, i)] = content(r, max/4)
	}
	return files
}

func tarOf(files map[string][]byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	slices.Sort(names)
	dirs := map[string]bool{}
	for _, p := range names {
		if d := filepath.Dir(p); d != "." && !dirs[d] {
			dirs[d] = true
			tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0)})
		}
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[p])), ModTime: time.Unix(1700000000, 0)})
		tw.Write(files[p])
	}
	tw.Close()
	return buf.Bytes()
}

func opCpAPI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	ss.n++
	root := fmt.Sprintf("cp/c%d", ss.n)
	files := tree(ss.rng, w.cfg.maxPut)
	_, err := w.client.CopyIn(ctx, ss.name, root, bytes.NewReader(tarOf(files)))
	ss.files.set(root+"/", treeDigest(files), err == nil)
	return err
}

func opCpCLI(ctx context.Context, w *soakWorld, ss *soakSession) error {
	ss.n++
	root := fmt.Sprintf("cp/c%d", ss.n)
	files := tree(ss.rng, w.cfg.maxPut)
	local := filepath.Join(w.tmp, fmt.Sprintf("%s-%d", ss.name, ss.n))
	for p, b := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(local, p)), 0o755)
		if err := os.WriteFile(filepath.Join(local, p), b, 0o644); err != nil {
			return err
		}
	}
	defer os.RemoveAll(local)
	args := []string{"cp", local, ss.name + ":" + root}
	_, errb, code, err := w.cli(ctx, nil, args...)
	if errors.Is(err, errSkipped) {
		return err
	}
	if err == nil && code != 0 {
		err = cliErr(args[:1], code, errb)
	}
	ss.files.set(root+"/", treeDigest(files), err == nil)
	return err
}

// awake wakes a sleeping session with a command, for what only a running
// VM does (pause, sleep).
func (w *soakWorld) awake(ctx context.Context, ss *soakSession) error {
	s, err := w.client.Get(ctx, ss.name)
	if err != nil || s.State != session.StateSleeping {
		return err
	}
	return w.runAPI(ctx, w.fixedExec(ss, "echo woke", "woke\n", 0, false), false)
}

func opPause(ctx context.Context, w *soakWorld, ss *soakSession) error {
	if err := w.awake(ctx, ss); err != nil {
		return err
	}
	if _, err := w.client.Pause(ctx, ss.name); err != nil {
		return err
	}
	if err := sleepCtx(ctx, time.Duration(200+ss.rng.IntN(1800))*time.Millisecond); err != nil {
		return err
	}
	_, err := w.client.Resume(ctx, ss.name)
	return err
}

// idle waits until the session runs no command, as a sleep needs.
func (w *soakWorld) idle(ctx context.Context, ss *soakSession, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		l, err := w.client.Executions(ctx, ss.name, false)
		if err != nil {
			return err
		}
		if len(l) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errSkipped
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

func opSleep(ctx context.Context, w *soakWorld, ss *soakSession) error {
	if err := w.awake(ctx, ss); err != nil {
		return err
	}
	if err := w.idle(ctx, ss, 30*time.Second); err != nil {
		return err
	}
	if _, err := w.client.Sleep(ctx, ss.name); err != nil {
		return err
	}
	if ss.rng.IntN(2) == 0 {
		return nil // the next operation wakes it
	}
	rec := w.fixedExec(ss, "echo woke", "woke\n", 0, false)
	return w.runAPI(ctx, rec, false)
}

func opCheckpoint(ctx context.Context, w *soakWorld, ss *soakSession) error {
	if err := w.pruneCheckpoints(ctx, ss, 1, ""); err != nil {
		return err
	}
	ss.n++
	ck, err := w.client.Checkpoint(ctx, ss.name, session.CheckpointOptions{Label: fmt.Sprintf("soak-%d", ss.n), Memory: ss.rng.IntN(4) == 0})
	if err != nil {
		return err
	}
	ss.ckpts[ck.ID] = ss.files.clone()
	ss.ckOrder = append(ss.ckOrder, ck.ID)
	return nil
}

// pruneCheckpoints keeps the session's checkpoints to the newest keep
// known ones and except (the data directory is small), and drops those
// the soak does not know the content of (taken by a checkpoint or restore
// the daemon's kill cut short).
func (w *soakWorld) pruneCheckpoints(ctx context.Context, ss *soakSession, keep int, except string) error {
	l, err := w.client.Checkpoints(ctx, ss.name)
	if err != nil {
		return err
	}
	for _, c := range l {
		if ss.ckpts[c.ID] == nil {
			if err := w.client.DeleteCheckpoint(ctx, ss.name, c.ID); err != nil && !errors.Is(err, session.ErrNotFound) {
				return err
			}
		}
	}
	for i := 0; len(ss.ckOrder) > keep && i < len(ss.ckOrder); {
		id := ss.ckOrder[i]
		if id == except {
			i++
			continue
		}
		if err := w.client.DeleteCheckpoint(ctx, ss.name, id); err != nil && !errors.Is(err, session.ErrNotFound) {
			return err
		}
		delete(ss.ckpts, id)
		ss.ckOrder = slices.Delete(ss.ckOrder, i, i+1)
	}
	return nil
}

func opRestore(ctx context.Context, w *soakWorld, ss *soakSession) error {
	if len(ss.ckOrder) == 0 {
		return opCheckpoint(ctx, w, ss)
	}
	id := ss.ckOrder[ss.rng.IntN(len(ss.ckOrder))]
	want := ss.ckpts[id]
	if err := w.pruneCheckpoints(ctx, ss, 1, id); err != nil {
		return err
	}
	res, err := w.client.Restore(ctx, ss.name, id)
	if err != nil {
		// Perhaps restored, perhaps not: either workspace is right.
		ss.files = ss.files.merge(want)
		return err
	}
	ss.ckpts[res.Auto.ID] = ss.files
	ss.ckOrder = append(ss.ckOrder, res.Auto.ID)
	ss.files = want.clone()
	return nil
}

// opForward serves a put file with busybox httpd in the guest and reads
// it back through the session's `berth port-forward` or, now and then,
// the API's forward.
func opForward(ctx context.Context, w *soakWorld, ss *soakSession) error {
	start := w.fixedExec(ss, "mkdir -p /workspace/www; pidof httpd >/dev/null || httpd -p 127.0.0.1:8080 -h /workspace/www </dev/null >/dev/null 2>&1", "", 0, false)
	if err := w.runAPI(ctx, start, false); err != nil {
		return err
	}
	b := content(ss.rng, w.cfg.maxPut)
	path := fmt.Sprintf("www/pf%d", ss.rng.IntN(3))
	_, err := w.client.WriteFile(ctx, ss.name, path, bytes.NewReader(b))
	ss.files.set(path, digest(b), err == nil)
	if err != nil {
		return err
	}
	var got []byte
	if ss.rng.IntN(3) == 0 {
		got, err = w.getAPI(ctx, ss.name, "/"+filepath.Base(path))
	} else {
		got, err = w.get(ctx, "http://"+ss.fwdAddr+"/"+filepath.Base(path))
	}
	if err != nil {
		return err
	}
	if !bytes.Equal(got, b) {
		return fmt.Errorf("%w: GET %s through the forward: %d bytes (%s), want %d (%s)", errWrong, path, len(got), digest(got)[:12], len(b), digest(b)[:12])
	}
	return nil
}

// errWrong marks a wrong answer: never excused by a kill or a full disk.
var errWrong = errors.New("wrong result")

func (w *soakWorld) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}

// getAPI does one HTTP GET over Service.Forward's connection.
func (w *soakWorld) getAPI(ctx context.Context, name, path string) ([]byte, error) {
	c, err := w.client.Forward(ctx, name, 8080)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s over the API's forward: %s", path, resp.Status)
	}
	return b, nil
}

// opPolicy changes the network policy, then checks that a new connection
// to the host follows it: allowed only by the allow policy naming it.
func opPolicy(ctx context.Context, w *soakWorld, ss *soakSession) error {
	allow := "allow:host.berth.internal:" + w.hostPort
	policies := []string{"none", "open", allow}
	p := policies[ss.rng.IntN(len(policies))]
	viaCLI := ss.rng.IntN(3) == 0
	var err error
	if viaCLI {
		args := []string{"net", ss.name, p}
		var errb []byte
		var code int
		if _, errb, code, err = w.cli(ctx, nil, args...); errors.Is(err, errSkipped) {
			return err
		} else if err == nil && code != 0 {
			err = cliErr(args[:2], code, errb)
		}
	} else {
		var s session.Session
		if s, err = w.client.SetNet(ctx, ss.name, p); err == nil && s.Net != p {
			return fmt.Errorf("%w: net %s → the session says %q", errWrong, p, s.Net)
		}
	}
	if err != nil {
		ss.policy[p] = true
		return err
	}
	ss.policy = map[string]bool{p: true}
	ss.n++
	marker := fmt.Sprintf("soak-%s-%d", ss.name, ss.n)
	rec := &execRec{session: ss.name, marker: marker, via: "api",
		script: fmt.Sprintf(": %s; wget -q -O- http://host.berth.internal:%s/%s", marker, w.hostPort, marker)}
	if p == allow {
		rec.wantOut, rec.wantCode = []byte("host says /"+marker), 0
	} else {
		rec.wantCode, rec.anyOut, rec.anyErr = nonZero, true, true
	}
	err = w.runAPI(ctx, rec, false)
	if err == nil && w.d.epoch.Load() != ss.epoch {
		err = errors.New("the daemon was killed during the check")
	}
	if err != nil {
		// The egress proxy is the daemon's: killed under a connection,
		// it ends it, and wget fails whatever the policy.
		rec.wantCode, rec.anyOut, rec.anyErr = anyCode, true, true
		return err
	}
	if (rec.gotCode == 0) != (p == allow) {
		return fmt.Errorf("%w: with policy %q wget of the host exited %d: %q %q", errWrong, p, rec.gotCode, rec.gotOut.String(), rec.gotErr.String())
	}
	return nil
}

func opFlush(ctx context.Context, w *soakWorld, ss *soakSession) error {
	_, err := w.client.Flush(ctx, ss.name)
	return err
}

func opStopStart(ctx context.Context, w *soakWorld, ss *soakSession) error {
	s, err := w.client.Stop(ctx, ss.name)
	if err != nil {
		return err
	}
	// A stop is clean: commands and what they left running ended, the
	// disks flushed, the workspace unmounted, not the VM killed.
	if s.State == session.StateStopped && !strings.Contains(s.Cause, "stopped cleanly") && !strings.Contains(s.Cause, "while asleep") {
		return fmt.Errorf("the stop was not clean: %s", s.Cause)
	}
	_, err = w.client.Start(ctx, ss.name)
	return err
}

// ready brings a session back to running or sleeping before an
// operation: a pause or stop the daemon's kill cut short leaves it paused
// or stopped.
func (w *soakWorld) ready(ctx context.Context, ss *soakSession) error {
	for range 240 {
		s, err := w.client.Get(ctx, ss.name)
		if err != nil {
			return err
		}
		switch s.State {
		case session.StateRunning, session.StateSleeping:
			return nil
		case session.StatePaused:
			_, err = w.client.Resume(ctx, ss.name)
		case session.StateStopped:
			_, err = w.client.Start(ctx, ss.name)
		case session.StateCrashed:
			w.crash(ss.name, s.Cause)
			_, err = w.client.Start(ctx, ss.name)
		default: // on its way somewhere: creating, stopping
			err = sleepCtx(ctx, 250*time.Millisecond)
		}
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("session %s did not settle within a minute", ss.name)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// noSpace reports whether err is a refusal for lack of room on the host.
func noSpace(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return errors.Is(err, syscall.ENOSPC) || strings.Contains(s, "host disk") || strings.Contains(s, "floor") ||
		strings.Contains(s, "no space") || strings.Contains(s, "output held")
}

// opStats counts one kind's outcomes.
type opStats struct {
	ok, interrupted, refused, skipped, failed int
	took                                      time.Duration
}

type statBook struct {
	mu sync.Mutex
	m  map[string]*opStats
}

func (b *statBook) add(kind string, f func(*opStats)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*opStats{}
	}
	if b.m[kind] == nil {
		b.m[kind] = &opStats{}
	}
	f(b.m[kind])
}
