package engine

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/engine/diskcopy"
)

// manifest hashes every file of a session's directory but vm/, with its
// allocated size, so a move can be seen to keep bytes and holes.
func manifest(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() && rel == "vm" {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		out[rel] = hex.EncodeToString(sum[:8])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func outputOf(t *testing.T, m *Manager, name string) map[string]string {
	t.Helper()
	xs, err := m.Executions(t.Context(), name, true)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, x := range xs {
		page, err := m.Output(t.Context(), x.ID, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, c := range page.Chunks {
			b.Write(c.Data)
		}
		out[x.ID] = strings.Join(x.Argv, " ") + " → " + string(x.State) + ": " + b.String()
	}
	return out
}

func sendOf(t *testing.T, m *Manager, name string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := m.SendSession(t.Context(), name, &b); err != nil {
		t.Fatalf("SendSession(%s): %v", name, err)
	}
	return b.Bytes()
}

func stagingLeft(t *testing.T, m *Manager) []string {
	t.Helper()
	ents, _ := os.ReadDir(m.movesDir())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestMoveBetweenManagers(t *testing.T) {
	src, dst := newAgentManager(t, 0), newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "mv"}); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{{"sh", "-c", "seq 1 5000; echo to-stderr >&2"}, {"sh", "-c", "exit 3"}} {
		p, err := src.Exec(ctx, "mv", session.ExecRequest{Argv: argv})
		if err != nil {
			t.Fatal(err)
		}
		for range p.Output() {
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.StartRun(ctx, "mv", session.RunOptions{Title: "a run"}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.AddSchedule(ctx, "mv", session.ScheduleRequest{Spec: "@daily", Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}

	// Running: refused, with what to do.
	err := src.SendSession(ctx, "mv", io.Discard)
	var se *session.Error
	if !errors.Is(err, session.ErrInvalidState) || !errors.As(err, &se) || !strings.Contains(se.Hint, "stop") {
		t.Fatalf("SendSession of a running session: %v; want ErrInvalidState with a hint to stop it", err)
	}
	if _, err := src.Stop(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Checkpoint(ctx, "mv", session.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	// Data past the filesystem's blocks, between holes: it must arrive
	// at the same offsets, and the holes stay holes.
	ws := filepath.Join(src.sessionDir("mv"), "workspace.img")
	f, err := os.OpenFile(ws, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	junk := make([]byte, 3<<20+17)
	for i := range junk {
		junk[i] = byte(rand.Uint32())
	}
	f.WriteAt(junk, fi.Size()-int64(len(junk))-(1<<20))
	f.Close()

	wantFiles := manifest(t, src.sessionDir("mv"))
	wantOut := outputOf(t, src, "mv")
	wantRuns, _ := src.Runs(ctx, "mv")
	wantCkpts, _ := src.Checkpoints(ctx, "mv")
	bundle := sendOf(t, src, "mv")

	// A host below its free-space floor takes nothing, and keeps nothing
	// of the refusal.
	full := newAgentManager(t, 0)
	full.cfg.Floor = 1 << 62
	if _, err := full.ReceiveSession(ctx, bytes.NewReader(bundle)); !errors.Is(err, session.ErrNoSpace) || !strings.Contains(err.Error(), `cannot take session mv here`) {
		t.Errorf("ReceiveSession below the floor: %v, want the floor's refusal", err)
	}
	if left, _ := os.ReadDir(full.movesDir()); len(left) != 0 {
		t.Errorf("a refused receive left %v", left)
	}

	staged, err := dst.ReceiveSession(ctx, bytes.NewReader(bundle))
	if err != nil {
		t.Fatalf("ReceiveSession: %v", err)
	}
	if staged.Name != "mv" || staged.State != session.StateStopped || staged.Bytes >= int64(len(bundle))+1 {
		t.Errorf("staged %+v", staged)
	}
	t.Logf("bundle %d bytes, %d files, %d bytes of data, %d of records; workspace %d bytes apparent", len(bundle), staged.Files, staged.Bytes, staged.Records, fi.Size())
	if _, err := dst.ReceiveSession(ctx, bytes.NewReader(bundle)); !errors.Is(err, session.ErrExists) {
		t.Errorf("a second receive: %v, want ErrExists", err)
	}
	got, err := dst.CommitReceived(ctx, "mv")
	if err != nil {
		t.Fatalf("CommitReceived: %v", err)
	}
	if got.State != session.StateStopped {
		t.Errorf("committed session is %s", got.State)
	}
	if again, err := dst.CommitReceived(ctx, "mv"); err != nil || again.Name != "mv" {
		t.Errorf("CommitReceived again = %+v, %v; want the session (idempotent)", again, err)
	}
	if left := stagingLeft(t, dst); len(left) != 0 {
		t.Errorf("staging left after commit: %v", left)
	}
	if gotFiles := manifest(t, dst.sessionDir("mv")); !mapsEqualS(gotFiles, wantFiles) {
		t.Errorf("files differ:\n got %v\nwant %v", gotFiles, wantFiles)
	}
	if a, b := diskcopy.Allocated(ws), diskcopy.Allocated(filepath.Join(dst.sessionDir("mv"), "workspace.img")); b > a+1<<20 {
		t.Errorf("the moved workspace holds %d bytes, the source's %d: holes were filled", b, a)
	}
	if gotOut := outputOf(t, dst, "mv"); !mapsEqualS(gotOut, wantOut) || len(gotOut) != 2 {
		t.Errorf("executions differ:\n got %v\nwant %v", gotOut, wantOut)
	}
	gotRuns, _ := dst.Runs(ctx, "mv")
	if len(gotRuns) != len(wantRuns) || len(gotRuns) != 1 || gotRuns[0].ID != wantRuns[0].ID {
		t.Errorf("runs %+v, want %+v", gotRuns, wantRuns)
	}
	if scs, _ := dst.Schedules(ctx, "mv"); len(scs) != 1 {
		t.Errorf("schedules %+v", scs)
	}
	gotCkpts, _ := dst.Checkpoints(ctx, "mv")
	if len(gotCkpts) != 1 || len(wantCkpts) != 1 || gotCkpts[0].ID != wantCkpts[0].ID {
		t.Errorf("checkpoints %+v, want %+v", gotCkpts, wantCkpts)
	}
	// The moved session runs there, and its new commands are recorded
	// beside the old.
	if _, err := dst.Start(ctx, "mv"); err != nil {
		t.Fatalf("start the moved session: %v", err)
	}
	p, err := dst.Exec(ctx, "mv", session.ExecRequest{Argv: []string{"echo", "moved"}})
	if err != nil {
		t.Fatal(err)
	}
	for range p.Output() {
	}
	p.Wait(ctx)
	if n := len(outputOf(t, dst, "mv")); n != 3 {
		t.Errorf("%d executions after one more, want 3", n)
	}

	// A copy changed after it was sent is not dropped.
	if _, err := src.Start(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Stop(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if err := src.DropSent(ctx, "mv"); !errors.Is(err, session.ErrConflict) {
		t.Errorf("DropSent after a start since the send: %v, want ErrConflict", err)
	}
	sendOf(t, src, "mv")
	// The source's copy goes once the target has it.
	if err := src.DropSent(ctx, "mv"); err != nil {
		t.Fatalf("DropSent: %v", err)
	}
	if _, err := src.Get(ctx, "mv"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("the source still lists the session: %v", err)
	}
	if _, err := os.Stat(src.sessionDir("mv")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the source's directory remains: %v", err)
	}
	if xs, _ := src.st.ListExecs("mv"); len(xs) != 0 {
		t.Errorf("the source's records remain: %d execs", len(xs))
	}
}

func mapsEqualS(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A damaged, cut or hostile bundle is refused with nothing staged; a
// staged one can be discarded; a partial staging goes at start.
func TestReceiveRefusesBadBundles(t *testing.T) {
	src, dst := newAgentManager(t, 0), newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "mv"}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Stop(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	bundle := sendOf(t, src, "mv")
	rng := rand.New(rand.NewPCG(3, 4))
	cases := map[string][]byte{"empty": nil, "cut before its end": bundle[:len(bundle)-3], "trailing byte": append(slices.Clone(bundle), 0)}
	for range 8 {
		n := rng.IntN(len(bundle))
		cases["cut at "+strconv.Itoa(n)] = bundle[:n]
		b := slices.Clone(bundle)
		b[n] ^= 0x10
		cases["flipped at "+strconv.Itoa(n)] = b
	}
	hostile := hostileBundle
	for _, p := range []string{"../escape", "/abs/path", "a/../../b", "a//b", ""} {
		cases["path "+p] = hostile(p, 1)
	}
	cases["file beyond bound"] = hostile("big", maxBundleFileSize+1)
	cases["data beyond the file"] = hostile("small", 0)
	for name, b := range cases {
		if _, err := dst.ReceiveSession(ctx, bytes.NewReader(b)); err == nil {
			t.Errorf("%s: staged", name)
			dst.DiscardReceived(ctx, "mv")
			dst.DiscardReceived(ctx, "evil")
		}
		if left := stagingLeft(t, dst); len(left) != 0 {
			t.Fatalf("%s: staging left: %v", name, left)
		}
		if _, err := os.Stat(filepath.Join(dst.cfg.DataDir, "escape")); err == nil {
			t.Fatalf("%s: a file escaped the staging", name)
		}
	}
	// Staged, then discarded: nothing left, and a commit finds nothing.
	if _, err := dst.ReceiveSession(ctx, bytes.NewReader(bundle)); err != nil {
		t.Fatal(err)
	}
	if err := dst.DiscardReceived(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if left := stagingLeft(t, dst); len(left) != 0 {
		t.Errorf("staging left after discard: %v", left)
	}
	if _, err := dst.CommitReceived(ctx, "mv"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("commit after discard: %v, want ErrNotFound", err)
	}
	// A missing image build is named.
	os.WriteFile(filepath.Join(dst.cfg.DataDir, "images", "mini", "current"), []byte("other\n"), 0o644)
	os.Rename(filepath.Join(dst.cfg.DataDir, "images", "mini", "fake"), filepath.Join(dst.cfg.DataDir, "images", "mini", "other"))
	if _, err := dst.ReceiveSession(ctx, bytes.NewReader(bundle)); !errors.Is(err, session.ErrNotFound) || !strings.Contains(err.Error(), "fake") {
		t.Errorf("receive without the image build: %v; want ErrNotFound naming the digest", err)
	}
	// A partial staging a crash left goes at the next start.
	os.MkdirAll(filepath.Join(dst.movesDir(), ".mv.partial-1", "session"), 0o755)
	dst.removePartialMoves()
	if left := stagingLeft(t, dst); len(left) != 0 {
		t.Errorf("partial staging left after start: %v", left)
	}
	// The source was not changed by any of it.
	if _, err := src.Get(ctx, "mv"); err != nil {
		t.Error(err)
	}
}

// hostileBundle is a bundle of one file at path, of size bytes, with one
// byte of data at 0, hashed as a sender would.
func hostileBundle(path string, size int64) []byte {
	var out bytes.Buffer
	bw := &bundleWriter{w: bufio.NewWriter(&out), sum: sha256.New()}
	bw.raw([]byte(bundleMagic))
	bw.raw([]byte{0, bundleVersion})
	h, _ := json.Marshal(bundleHeader{Name: "evil", State: session.StateStopped, Image: "mini", ImageDigest: "fake", VMM: "qemu"})
	bw.frame(bframeHeader, h)
	fh, _ := json.Marshal(bundleFile{Path: path, Size: size, Mode: 0o644})
	bw.frame(bframeFile, fh)
	bw.chunk(bframeData, make([]byte, 8), []byte("x"))
	bw.chunk(bframeRecords, nil, []byte("records"))
	bw.end()
	return out.Bytes()
}

// The bundle's parser meets a network peer's bytes: it must refuse, not
// crash or write outside its staging, and leave nothing of a refusal.
func FuzzReceiveSession(f *testing.F) {
	src, dst := newAgentManager(f, 0), newAgentManager(f, 0)
	ctx := f.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "mv"}); err != nil {
		f.Fatal(err)
	}
	if _, err := src.Stop(ctx, "mv"); err != nil {
		f.Fatal(err)
	}
	var b bytes.Buffer
	if err := src.SendSession(ctx, "mv", &b); err != nil {
		f.Fatal(err)
	}
	// The seed keeps the bundle's head, its first data and its records:
	// the workspace's 16 MiB would make every run slow.
	f.Add(b.Bytes()[:min(b.Len(), 64<<10)])
	f.Add(hostileBundle("ok", 1))
	f.Add(hostileBundle("../x", 1))
	outside := filepath.Dir(dst.movesDir())
	f.Fuzz(func(t *testing.T, in []byte) {
		st, err := dst.ReceiveSession(ctx, bytes.NewReader(in))
		if err == nil {
			if err := dst.DiscardReceived(ctx, st.Name); err != nil {
				t.Fatal(err)
			}
		}
		ents, _ := os.ReadDir(dst.movesDir())
		if len(ents) != 0 {
			t.Fatalf("staging left (err %v): %v", err, ents)
		}
		for _, n := range []string{"x", "evil"} {
			if _, err := os.Lstat(filepath.Join(outside, n)); err == nil {
				t.Fatalf("%s written outside the staging", n)
			}
		}
	})
}

// TestMoveThroughput moves a session with 128 MiB of random data in a
// 1 GiB workspace between two managers through a pipe, and copies the
// same files with cp --sparse=always on the same disk, synced as the
// receiver syncs: the ratio is the move's cost over its physical limit.
// BERTH_BENCH=1 runs it (make bench).
func TestMoveThroughput(t *testing.T) {
	if os.Getenv("BERTH_BENCH") == "" {
		t.Skip("set BERTH_BENCH=1 (make bench)")
	}
	src, dst := newAgentManager(t, 0), newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "big", DiskBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Stop(ctx, "big"); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(src.sessionDir("big"), "workspace.img")
	f, err := os.OpenFile(ws, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 128 {
		for j := 0; j < len(buf); j += 8 {
			binary.LittleEndian.PutUint64(buf[j:], rng.Uint64())
		}
		// 1 MiB of data every 4 MiB from 64 MiB on: extents between holes.
		if _, err := f.WriteAt(buf, 64<<20+int64(i)*(4<<20)); err != nil {
			t.Fatal(err)
		}
	}
	f.Sync()
	f.Close()
	exec.Command("sync").Run()

	start := time.Now()
	out := filepath.Join(filepath.Dir(src.cfg.DataDir), "cp-"+filepath.Base(src.cfg.DataDir))
	os.MkdirAll(out, 0o755)
	if b, err := exec.Command("cp", "--sparse=always", ws, out).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, b)
	}
	exec.Command("sync", filepath.Join(out, "workspace.img")).Run()
	cpTook := time.Since(start)
	os.RemoveAll(out)

	res, err := session.Move(ctx, src, dst, "big", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mb := float64(res.Staged.Bytes) / (1 << 20)
	t.Logf("move: %.1f MiB of data (1 GiB apparent) in %s: %.0f MiB/s; cp --sparse=always + sync: %s: %.0f MiB/s; move/cp = %.2f",
		mb, res.Took.Round(time.Millisecond), mb/res.Took.Seconds(), cpTook.Round(time.Millisecond), mb/cpTook.Seconds(), res.Took.Seconds()/cpTook.Seconds())
}

// A target without the session's image build gets it, by its digest, as
// the source has it, and the session starts there on it.
func TestMoveShipsImageBuild(t *testing.T) {
	src, dst := newAgentManager(t, 0), newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := src.Create(ctx, session.CreateOptions{Name: "mv"}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Stop(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	// The target has another build of mini, not the session's.
	images := filepath.Join(dst.cfg.DataDir, "images", "mini")
	os.WriteFile(filepath.Join(images, "current"), []byte("other\n"), 0o644)
	os.Rename(filepath.Join(images, "fake"), filepath.Join(images, "other"))
	os.WriteFile(filepath.Join(src.cfg.DataDir, "images", "mini", "fake", "vmlinuz"), []byte("the source's kernel"), 0o644)

	res, err := session.Move(ctx, src, dst, "mv", nil, nil)
	if err != nil {
		t.Fatalf("Move: %v", err)
	}
	if res.Session.Name != "mv" {
		t.Errorf("moved %+v", res.Session)
	}
	if b, err := os.ReadFile(filepath.Join(images, "fake", "vmlinuz")); err != nil || string(b) != "the source's kernel" {
		t.Errorf("the target's copy of the build: %q, %v", b, err)
	}
	if cur, _ := os.ReadFile(filepath.Join(images, "current")); string(cur) != "other\n" {
		t.Errorf("the target's current build changed to %q", cur)
	}
	if _, err := dst.Start(ctx, "mv"); err != nil {
		t.Fatalf("start on the shipped build: %v", err)
	}
	// A second shipping of the same build is refused as here already.
	var b bytes.Buffer
	if err := dst.SendSessionImage(ctx, "mv", &b); err != nil {
		t.Fatal(err)
	}
	if err := dst.ReceiveImage(ctx, bytes.NewReader(b.Bytes())); !errors.Is(err, session.ErrExists) {
		t.Errorf("receiving a build that is here: %v, want ErrExists", err)
	}
	// A damaged one leaves nothing.
	bad := slices.Clone(b.Bytes())
	bad[len(bad)/2] ^= 1
	os.RemoveAll(filepath.Join(images, "fake"))
	if err := dst.ReceiveImage(ctx, bytes.NewReader(bad)); err == nil {
		t.Error("a damaged image bundle was stored")
	}
	if ents, _ := os.ReadDir(images); len(ents) != 2 { // current, other
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("after a refused image bundle: %v", names)
	}
}
