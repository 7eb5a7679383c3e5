package app_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// check verifies, after the soak, every promise that must have held
// through it:
//
//   - every execution that ended exited 0 (or with the exit code its
//     script ends with) replays byte-exact: its kept output is what its
//     script prints, and what the client was shown is that or, when the
//     daemon's kill cut the client off, the start of it;
//   - no execution is silently missing: each one the daemon acknowledged
//     (an id, output, an end) is recorded exactly once, and one that did
//     not end normally says why (lost with a reason);
//   - every acknowledged put and copy is in the workspace byte-exact (the
//     content of the last checkpoint restored where there was a restore);
//   - each session's network policy is the last one set;
//   - no VMM is orphaned or duplicated: one QEMU process per running or
//     paused session, the one the session names, and none for a session
//     asleep or stopped;
//   - the store opened clean at the last start, and no daemon raced,
//     panicked, broke the lock order or died by itself;
//   - every session answers a command.
func (w *soakWorld) check() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, ss := range w.sessions {
		w.checkExecs(ctx, ss)
		w.checkFiles(ctx, ss)
		s, err := w.client.Get(ctx, ss.name)
		if err != nil {
			w.fail("get %s: %v", ss.name, err)
			continue
		}
		if !ss.policy[s.Net] {
			w.fail("session %s has network policy %q, want one of %v", ss.name, s.Net, slices.Sorted(maps.Keys(ss.policy)))
		}
		w.checked["policies"]++
	}
	w.checkVMMs(ctx)
	w.checkLogs()
	// Last: every session answers (sleeping ones wake for it).
	for _, ss := range w.sessions {
		want := "alive " + ss.name + "\n"
		rec := w.fixedExec(ss, "echo alive "+ss.name, want, 0, false)
		if err := w.runAPI(ctx, rec, false); err != nil || rec.gotOut.String() != want {
			w.fail("session %s does not answer: %v %q", ss.name, err, rec.gotOut.String())
			continue
		}
		w.checked["sessions answering"]++
	}
	if n := len(w.strayDaemons()); n > 0 {
		w.fail("%d daemons of the data directory besides the supervised one", n)
	}
}

func (w *soakWorld) checkExecs(ctx context.Context, ss *soakSession) {
	all, err := w.client.Executions(ctx, ss.name, true)
	if err != nil {
		w.fail("executions of %s: %v", ss.name, err)
		return
	}
	byMarker := map[string][]session.Execution{}
	markerRE := regexp.MustCompile(`: (soak-` + regexp.QuoteMeta(ss.name) + `-[0-9]+);`)
	for _, x := range all {
		if m := markerRE.FindStringSubmatch(strings.Join(x.Argv, " ")); m != nil {
			byMarker[m[1]] = append(byMarker[m[1]], x)
		}
	}
	for _, rec := range ss.execs {
		found := byMarker[rec.marker]
		switch {
		case len(found) > 1:
			w.fail("%s (%s, %s) is recorded %d times", rec.marker, rec.via, ss.name, len(found))
			continue
		case len(found) == 0:
			if rec.acked || rec.id != "" {
				w.fail("%s (%s on %s, id %q) was acknowledged but is not recorded", rec.marker, rec.via, ss.name, rec.id)
			}
			w.checked["executions never taken"]++
			continue
		}
		x := found[0]
		if rec.id != "" && x.ID != rec.id {
			w.fail("%s: the API said id %s, the record is %s", rec.marker, rec.id, x.ID)
		}
		w.checkExec(ctx, rec, x)
	}
}

func (w *soakWorld) checkExec(ctx context.Context, rec *execRec, x session.Execution) {
	what := fmt.Sprintf("%s (%s %s on %s)", rec.marker, rec.via, x.ID, rec.session)
	w.checked["executions"]++
	w.checked["executions "+string(x.State)]++
	if !x.State.Done() {
		w.fail("%s is still %s", what, x.State)
		return
	}
	if len(rec.gaps) > 0 {
		w.fail("%s: the client's stream skipped: %s", what, strings.Join(rec.gaps, ", "))
	}
	if x.State != session.ExecExited {
		// Lost, cancelled by a restore or stop, killed: only with a reason.
		if x.Error == "" && x.Signal == "" {
			w.fail("%s ended %s with no reason", what, x.State)
		}
		if rec.complete && rec.gotCode >= 0 {
			// Only an end the full disk kept from the store, which the
			// daemon logged and reported with the end (the API's Error,
			// the CLI's stderr): a crash before berth stored it loses it.
			if x.State == session.ExecLost && w.endUnrecorded(x.ID) {
				w.checked["executions whose end a full disk kept from the record (reported so)"]++
			} else {
				w.fail("%s: the client saw it exit %d, the record says %s", what, rec.gotCode, x.State)
			}
		}
		return
	}
	code := exitCode(x)
	if rec.wantCode >= 0 && code != rec.wantCode || rec.wantCode == nonZero && code == 0 {
		w.fail("%s exited %d, want %d", what, code, rec.wantCode)
	}
	if rec.complete && rec.gotCode != code {
		w.fail("%s: the client saw exit %d, the record says %d", what, rec.gotCode, code)
	}
	out, errb, gap, err := w.replay(ctx, x.ID)
	if err != nil {
		w.fail("replay %s: %v", what, err)
		return
	}
	w.checked["bytes replayed"] += len(out) + len(errb)
	if gap != 0 {
		w.fail("%s: the replay reports %d bytes trimmed", what, gap)
	}
	if int64(len(out)) != x.StdoutBytes || int64(len(errb)) != x.StderrBytes {
		w.fail("%s: the record counts %d+%d bytes, the replay has %d+%d", what, x.StdoutBytes, x.StderrBytes, len(out), len(errb))
	}
	if !rec.anyOut && !bytes.Equal(out, rec.wantOut) {
		w.fail("%s: stdout replays %d bytes (%s), the script prints %d (%s)%s", what, len(out), digest(out)[:12], len(rec.wantOut), digest(rec.wantOut)[:12], firstDiff(out, rec.wantOut))
	}
	if !rec.anyErr && !bytes.Equal(errb, rec.wantErr) {
		w.fail("%s: stderr replays %q, the script prints %q", what, clip(errb), clip(rec.wantErr))
	}
	// What the client was shown: all of it when it saw the end, else
	// the start of it. (The CLI's and ssh's stderr carry berth's own
	// notices too, so only stdout is compared there.)
	got := rec.gotOut.Bytes()
	if rec.complete && !bytes.Equal(got, out) || !rec.complete && !bytes.HasPrefix(out, got) {
		w.fail("%s: the client was shown %d bytes of stdout (complete %v), the record keeps %d%s", what, len(got), rec.complete, len(out), firstDiff(got, out))
	}
	if rec.via == "api" {
		ge := rec.gotErr.Bytes()
		if rec.complete && !bytes.Equal(ge, errb) || !rec.complete && !bytes.HasPrefix(errb, ge) {
			w.fail("%s: the client was shown stderr %q, the record keeps %q", what, clip(ge), clip(errb))
		}
	}
	if rec.attached {
		w.checked["executions followed across a restart"]++
	}
}

func (w *soakWorld) replay(ctx context.Context, id string) (out, errb []byte, gap int64, err error) {
	var o, e bytes.Buffer
	next := uint64(1)
	for {
		p, err := w.client.Output(ctx, id, next, 1024)
		if err != nil {
			return nil, nil, 0, err
		}
		gap += p.Gap
		if len(p.Chunks) == 0 {
			return o.Bytes(), e.Bytes(), gap, nil
		}
		for _, c := range p.Chunks {
			if c.Seq != next {
				return nil, nil, 0, fmt.Errorf("chunk %d where %d was due", c.Seq, next)
			}
			next++
			if c.Stream == session.Stderr {
				e.Write(c.Data)
			} else {
				o.Write(c.Data)
			}
		}
	}
}

func (w *soakWorld) checkFiles(ctx context.Context, ss *soakSession) {
	paths := slices.Sorted(maps.Keys(ss.files))
	for _, p := range paths {
		want := ss.files[p]
		got, err := w.workspaceDigest(ctx, ss.name, p)
		if err != nil {
			w.fail("read %s in %s: %v", p, ss.name, err)
			continue
		}
		if !want[got] {
			w.fail("%s in %s holds %s, want one of %s", p, ss.name, digestSet{got: true}, want)
			continue
		}
		if len(want) == 1 {
			w.checked["files and trees, certain"]++
		} else {
			w.checked["files and trees, either of two"]++
		}
	}
}

// workspaceDigest is a file's digest, or for a tree ("dir/") its files'.
func (w *soakWorld) workspaceDigest(ctx context.Context, name, p string) (string, error) {
	if root, ok := strings.CutSuffix(p, "/"); ok {
		r, err := w.client.CopyOut(ctx, name, root)
		if errors.Is(err, session.ErrNotFound) {
			return absent, nil
		}
		if err != nil {
			return "", err
		}
		defer r.Close()
		files := map[string][]byte{}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return "", err
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return "", err
			}
			files[strings.TrimPrefix(h.Name, "./")] = b
		}
		return treeDigest(files), nil
	}
	r, err := w.client.ReadFile(ctx, name, p)
	if errors.Is(err, session.ErrNotFound) {
		return absent, nil
	}
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	return digest(b), nil
}

// checkVMMs compares the QEMU processes on the data directory with the
// sessions' states.
func (w *soakWorld) checkVMMs(ctx context.Context) {
	l, err := w.client.List(ctx)
	if err != nil {
		w.fail("list: %v", err)
		return
	}
	procs := vmms(w.data)
	known := map[string]bool{}
	for _, s := range l {
		known[s.Name] = true
		pids := procs[s.Name]
		switch s.State {
		case session.StateRunning, session.StatePaused:
			if len(pids) != 1 || pids[0] != s.Pid {
				w.fail("session %s is %s with VMM pid %d; QEMU processes for it: %v", s.Name, s.State, s.Pid, pids)
				continue
			}
		default:
			if len(pids) != 0 {
				w.fail("session %s is %s, yet QEMU processes %v run for it", s.Name, s.State, pids)
				continue
			}
		}
		w.checked["sessions' VMMs"]++
	}
	for name, pids := range procs {
		if !known[name] {
			w.fail("QEMU processes %v run for %s, which is no session", pids, name)
		}
	}
}

// logProblems are lines no daemon may log: the race detector's, a panic,
// a runtime fatal error, and the lock-order checker's.
var logProblems = regexp.MustCompile(`WARNING: DATA RACE|^panic: |fatal error: |POTENTIAL DEADLOCK|Inconsistent locking`)

// endUnrecorded reports whether the daemon logged that it could not
// store execution id's end.
func (w *soakWorld) endUnrecorded(id string) bool {
	for _, l := range strings.Split(w.d.log(0), "\n") {
		if strings.Contains(l, `msg="record execution end"`) && strings.Contains(l, "exec="+id+" ") {
			return true
		}
	}
	return false
}

// checkLogs reads the daemons' logs: nothing in logProblems in any, no
// daemon that died by itself, and a last start whose store opened clean
// (no error logged, no write held).
func (w *soakWorld) checkLogs() {
	all := w.d.log(0)
	for _, l := range strings.Split(all, "\n") {
		if logProblems.MatchString(l) {
			w.fail("the daemon logged %q (the log is kept at the end)", l)
			break
		}
	}
	w.d.mu.Lock()
	unexpected := len(w.d.unexpected)
	w.d.mu.Unlock()
	if unexpected > 0 {
		w.fail("the daemon died by itself %d times", unexpected)
	}
	last := w.d.log(w.d.lastStart())
	for _, l := range strings.Split(last, "\n") {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "store writes are held") || strings.Contains(l, "component=store") && strings.Contains(l, "level=WARN") {
			w.fail("the last start (after kill -9) logged %q", l)
		}
	}
	w.checked["daemon starts checked"] = len(w.d.starts)
}

// report prints the soak's figures.
func (w *soakWorld) report() {
	t := w.t
	w.mu.Lock()
	kills, quick, fullStarts := w.kills, w.quick, w.fullStarts
	w.mu.Unlock()
	t.Logf("soak: seed %d, %d sessions, %s of operations (%s in all)", w.cfg.seed, len(w.sessions), w.chaosEnd.Sub(w.began).Round(time.Second), time.Since(w.began).Round(time.Second))
	var starts []string
	for _, d := range w.d.restarts {
		starts = append(starts, d.Round(10*time.Millisecond).String())
	}
	t.Logf("soak: daemon killed with SIGKILL %d times (%d soon after a start), plus once before the checks; %d starts (to answering: %s); %d refused to start on the full disk; died by itself %d times",
		kills, quick, len(w.d.restarts), strings.Join(starts, " "), fullStarts, len(w.d.unexpected))
	if w.fill != nil {
		s, e, minFree := w.fill.window()
		if !s.IsZero() {
			t.Logf("soak: data directory filled at +%s for %s (down to %d MiB free of %d MiB, floor 96 MiB), then emptied",
				s.Sub(w.began).Round(time.Second), e.Sub(s).Round(time.Second), minFree>>20, w.cfg.fsSize>>20)
		} else {
			t.Logf("soak: the fill did not happen")
		}
	}
	if w.mnt != "" {
		if free, err := freeSpace(w.mnt); err == nil {
			t.Logf("soak: the data directory's filesystem has %d MiB of %d MiB free at the end", free>>20, w.cfg.fsSize>>20)
		}
	}
	w.stats.mu.Lock()
	kinds := slices.Sorted(maps.Keys(w.stats.m))
	total := 0
	for _, k := range kinds {
		s := w.stats.m[k]
		n := s.ok + s.interrupted + s.refused + s.skipped + s.failed
		total += n
		t.Logf("soak:   %-13s %4d: %4d ok, %3d cut by a kill, %3d refused (disk full), %3d skipped, %3d failed; mean %s",
			k, n, s.ok, s.interrupted, s.refused, s.skipped, s.failed, (s.took / time.Duration(max(n, 1))).Round(time.Millisecond))
	}
	w.stats.mu.Unlock()
	t.Logf("soak: %d operations", total)
	keys := slices.Sorted(maps.Keys(w.checked))
	for _, k := range keys {
		t.Logf("soak: checked %-40s %d", k, w.checked[k])
	}
	for _, f := range w.fwds {
		if e := strings.TrimSpace(f.errors()); e != "" {
			t.Logf("soak: port-forward said: %s", clip([]byte(e)))
		}
	}
}

func clip(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// firstDiff says where a and b first differ.
func firstDiff(a, b []byte) string {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			lo := max(0, i-40)
			return fmt.Sprintf("; first difference at byte %d: %q vs %q", i, a[lo:min(len(a), i+40)], b[lo:min(len(b), i+40)])
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("; one is the other's first %d bytes", n)
	}
	return ""
}

// histories prints, for a failing run, what the soak did to the daemon
// and the disk, and each blamed session's operations and timeline.
func (w *soakWorld) histories() {
	t := w.t
	w.mu.Lock()
	events := slices.Clone(w.events)
	blamed := slices.Sorted(maps.Keys(w.blamed))
	w.mu.Unlock()
	t.Logf("soak: the daemon and the disk:\n  %s", strings.Join(events, "\n  "))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range blamed {
		ss := w.byName[name]
		if ss == nil {
			continue
		}
		t.Logf("soak: %s's operations:\n  %s", name, strings.Join(ss.hist, "\n  "))
		if !w.d.isUp() {
			continue
		}
		evs, err := w.client.Timeline(ctx, name, 60)
		if err != nil {
			t.Logf("soak: %s's timeline: %v", name, err)
			continue
		}
		var lines []string
		for _, e := range evs {
			msg := e.Message
			if e.Session != nil {
				msg = strings.TrimSpace(fmt.Sprintf("%s (%s) %s", e.Session.State, e.Session.Cause, msg))
			}
			if e.Exec != nil {
				msg = strings.TrimSpace(fmt.Sprintf("%s %s %s %s", e.Exec.ID, e.Exec.State, e.Exec.Error, msg))
			}
			lines = append(lines, fmt.Sprintf("%7.2fs %-6s %s", e.Time.Sub(w.began).Seconds(), e.Kind, msg))
		}
		t.Logf("soak: %s's timeline (the last 60 events):\n  %s", name, strings.Join(lines, "\n  "))
	}
}
