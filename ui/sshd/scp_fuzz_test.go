package sshd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// FuzzSCPSink plays a client uploading with classic scp (`scp -t`): the
// fuzzer writes the protocol lines and file bytes. Property: the server
// answers only with acks (a zero byte) and one-line warnings ("\x01scp:
// …\n"); every item of the upload lands at or below the target (the
// directory it names, or the file it names), nothing else in the
// workspace changes, whatever the names, modes, sizes and nesting; a
// file is never longer than what the client sent. And every item line
// the server accepts round-trips: printed back as scp prints it, it
// parses to the same mode, size and name.
func FuzzSCPSink(f *testing.F) {
	for _, s := range []string{
		"C0644 5 a.txt\nhello\x00",
		"T1700000000 0 1700000000 0\nC0755 3 run.sh\nabc\x00",
		"D0755 0 sub\nC0600 2 x\nhi\x00E\n",
		"D0755 0 sub\nD0700 0 deeper\nC0644 0 empty\n\x00E\nE\n",
		"C0644 5 ../escape\nhello\x00",
		"C0644 5 a/b\nhello\x00",
		"C04755 1 suid\nx\x00",
		"C0644 99 short\nabc",
		"C0644 -1 neg\n",
		"E\n",
		"\x01scp: client warning\nC0644 1 after\nz\x00",
		"\x02scp: fatal\n",
		"C0644 3 ..\nabc\x00",
		"D0755 0 .\nE\n",
		"X what\n",
		"T1 2 3\n",
		"C0644 1 " + strings.Repeat("n", 5000) + "\nx\x00",
		"C0644 2 twice\nab\x01warned\nC0644 2 twice\ncd\x00",
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, in []byte, mode uint8) {
		fake := sessiontest.New(sessiontest.Options{})
		defer fake.Close()
		const sn = "work"
		if err := fake.AddSession(session.Session{Name: sn, State: session.StateRunning, DiskBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		seed := time.Unix(1700000000, 0)
		fake.AddDir(sn, "up", seed)
		fake.AddFile(sn, "keep.txt", []byte("keep"), seed)
		fake.AddFile(sn, "up/old", []byte("old"), seed)
		args := scpArgs{sink: true, recursive: mode&1 != 0, preserve: mode&2 != 0, targetDir: mode&4 != 0}
		target := "up"
		if mode&8 != 0 {
			target = "single.txt" // a file that does not exist yet
		}
		args.path = target
		before := workspaceState(t, fake, sn)

		var out, stderr bytes.Buffer
		tr := &scpTransfer{ctx: context.Background(), svc: fake, handles: fake, name: sn, args: args,
			r: bufio.NewReaderSize(bytes.NewReader(in), 64<<10), w: &out, stderr: &stderr}
		done := make(chan error, 1)
		go func() { done <- tr.sink() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("sink did not end on %q", in)
		}

		// Acks and one-line warnings only.
		for o := out.Bytes(); len(o) > 0; {
			switch o[0] {
			case 0:
				o = o[1:]
			case 1:
				i := bytes.IndexByte(o, '\n')
				if i < 0 || !bytes.HasPrefix(o, []byte("\x01scp: ")) || bytes.ContainsAny(o[:i], "\r") {
					t.Fatalf("the server wrote %q", o)
				}
				o = o[i+1:]
			default:
				t.Fatalf("the server wrote %q", o)
			}
		}

		after := workspaceState(t, fake, sn)
		for p, st := range after {
			if before[p] == st {
				continue
			}
			if p != target && !strings.HasPrefix(p, target+"/") {
				t.Fatalf("the upload into %q changed %q (%s → %s)", target, p, before[p], st)
			}
			var size int
			if _, err := fmt.Sscanf(st, "-%d", &size); err == nil && size > len(in) {
				t.Fatalf("%q holds %d bytes; the client sent %d", p, size, len(in))
			}
		}
		for p := range before {
			if _, ok := after[p]; !ok {
				t.Fatalf("the upload removed %q", p)
			}
		}

		// Item lines round-trip.
		for _, line := range strings.Split(string(in), "\n") {
			if line == "" || (line[0] != 'C' && line[0] != 'D') {
				continue
			}
			m, size, name, err := parseItem(line)
			if err != nil {
				continue
			}
			if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || size < 0 {
				t.Fatalf("parseItem(%q) accepted name %q size %d", line, name, size)
			}
			bits := uint32(m.Perm())
			if m&fs.ModeSetuid != 0 {
				bits |= 0o4000
			}
			if m&fs.ModeSetgid != 0 {
				bits |= 0o2000
			}
			if m&fs.ModeSticky != 0 {
				bits |= 0o1000
			}
			again := fmt.Sprintf("%c%04o %d %s", line[0], bits, size, name)
			m2, size2, name2, err := parseItem(again)
			if err != nil || m2 != m || size2 != size || name2 != name {
				t.Fatalf("parseItem(%q) = %v %d %q, printed %q parses to %v %d %q %v", line, m, size, name, again, m2, size2, name2, err)
			}
		}
	})
}

// workspaceState maps each path of the workspace to its kind, size and
// content digest.
func workspaceState(t *testing.T, fake *sessiontest.Fake, sn string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var walk func(p string)
	walk = func(p string) {
		ents, err := fake.ListDir(ctx, sn, p)
		if err != nil {
			t.Fatalf("list %s: %v", p, err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
		for _, e := range ents {
			q := strings.TrimPrefix(path.Join(p, e.Name), "./")
			switch {
			case e.IsDir():
				out[q] = "d"
				walk(q)
			case e.Mode.IsRegular():
				rc, err := fake.ReadFile(ctx, sn, q)
				if err != nil {
					t.Fatalf("read %s: %v", q, err)
				}
				b, _ := io.ReadAll(rc)
				rc.Close()
				out[q] = fmt.Sprintf("-%d %x", len(b), b[:min(len(b), 32)])
			default:
				out[q] = fmt.Sprintf("%v %s", e.Mode, e.Link)
			}
		}
	}
	walk(".")
	return out
}
