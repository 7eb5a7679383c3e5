package ui

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/internal/uitest"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata")

// now is the fixed clock of every UI test, so ages and uptimes are stable.
var now = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

// keys records every key a test in this package presses, for the key map
// coverage check in TestMain.
var keys uitest.Coverage

// fixture fills a fake with a few sessions in every interesting state,
// executions with output, and workspace files.
func fixture() *sessiontest.Fake { return fixtureWith(sessiontest.Options{}) }

// fixtureWith is fixture with knobs set in opts (Delay, ...). The fake's
// clock is now, Create's defaults 2 vCPUs, 1 GiB, 10 GiB, a flush takes
// 120 ms, and /bin/sh prints what it was asked to run ("ran: ...").
func fixtureWith(opts sessiontest.Options) *sessiontest.Fake {
	opts.Now = func() time.Time { return now }
	opts.CPUs, opts.MemoryMiB, opts.DiskBytes = 2, 1024, 10<<30
	opts.FlushTook = 120 * time.Millisecond
	f := sessiontest.New(opts)
	f.Handle("sh", func(_ context.Context, p *sessiontest.Proc) (int, error) {
		fmt.Fprintf(p.Stdout, "ran: %s\n", strings.Join(p.Args, " "))
		return 0, nil
	})
	add := func(s session.Session) { must(f.AddSession(s)) }
	add(session.Session{Name: "alpha", State: session.StateRunning, Cause: "booted", CPUs: 2, MemoryMiB: 2048, DiskBytes: 10 << 30,
		Image: "mini", VMM: "qemu", Accel: "tcg", Pid: 4242, CreatedAt: now.Add(-72 * time.Hour), StartedAt: now.Add(-3*time.Hour - 12*time.Minute),
		LastActivity: now.Add(-2 * time.Minute), WorkspaceUsed: 1288 << 20, DirtyBytes: 12<<20 + 300<<10, Running: 1})
	// Ten minutes of alpha's figures, every 2 s, for the session view's
	// graphs; the newest sample is the table's CPU and MEM.
	samples := make([]session.Sample, 300)
	for i := range samples {
		disk := float32(64 << 10)
		if i%17 == 0 {
			disk = 4 << 20
		}
		samples[i] = session.Sample{Time: now.Add(-time.Duration(299-i) * 2 * time.Second), CPUPercent: float32(i * 7 % 100),
			MemUsedBytes: 600<<20 + int64(i)<<20, RSSBytes: 700 << 20, DiskBps: disk, DirtyBytes: int64(i) * 40 << 10}
	}
	samples[299].DirtyBytes = 12<<20 + 300<<10
	must(f.AddSample("alpha", samples...))
	add(session.Session{Name: "build-cache", State: session.StatePaused, Cause: "paused by admin", CPUs: 4, MemoryMiB: 4096, DiskBytes: 50 << 30,
		Image: "mini", VMM: "qemu", Accel: "tcg", Pid: 4300, StartedAt: now.Add(-26 * time.Hour), LastActivity: now.Add(-5 * time.Hour),
		WorkspaceUsed: 31 << 30, DirtyBytes: 2 << 20})
	add(session.Session{Name: "ci-runner-7", State: session.StateCrashed, Cause: "VMM killed by SIGKILL: out of memory", CPUs: 1, MemoryMiB: 512,
		DiskBytes: 5 << 30, Image: "mini", VMM: "qemu", LastActivity: now.Add(-40 * time.Minute), WorkspaceUsed: 4700 << 20})
	add(session.Session{Name: "docs", State: session.StateStopped, Cause: "stopped by tui", CPUs: 1, MemoryMiB: 1024, DiskBytes: 2 << 30,
		Image: "mini", VMM: "qemu", LastActivity: now.Add(-50 * time.Hour), WorkspaceUsed: 120 << 20})
	add(session.Session{Name: "experiment", State: session.StateSleeping, Cause: "idle 30m", CPUs: 2, MemoryMiB: 1024, DiskBytes: 10 << 30,
		Image: "mini", VMM: "qemu", LastActivity: now.Add(-31 * time.Minute), WorkspaceUsed: 800 << 20})

	code0, code2 := 0, 2
	must(f.AddExecution(session.Execution{ID: "x0000001abcdef", Session: "alpha", Argv: []string{"/bin/sh", "-c", "make deps"}, By: "cli",
		State: session.ExecExited, ExitCode: &code0, StartedAt: now.Add(-3 * time.Hour), EndedAt: now.Add(-3*time.Hour + 42*time.Second),
		StdoutBytes: 5120, StderrBytes: 0},
		session.Chunk{Stream: session.Stdout, Data: []byte("fetching modules\nok\n")}))
	must(f.AddExecution(session.Execution{ID: "x0000002bcdefa", Session: "alpha", Argv: []string{"/bin/sh", "-c", "go test ./..."}, By: "tui",
		State: session.ExecExited, ExitCode: &code2, StartedAt: now.Add(-20 * time.Minute), EndedAt: now.Add(-18*time.Minute - 30*time.Second),
		StdoutBytes: 800, StderrBytes: 210},
		// Coloured as a test runner colours it: basic, bold, 256 and
		// 24-bit colours (';' and ':' forms), one never reset.
		session.Chunk{Stream: session.Stdout, Time: now.Add(-20 * time.Minute), Data: []byte("=== RUN   TestParse\n--- \x1b[32mPASS\x1b[0m: TestParse (0.00s)\n=== RUN   TestFlush\n")},
		session.Chunk{Stream: session.Stderr, Time: now.Add(-19 * time.Minute), Data: []byte("\x1b[1mflush_test.go:42\x1b[22m: dirty bytes = \x1b[38;5;208m4096\x1b[39m, want 0\n\x1b[31mFAIL\x1b[0m\tTestFlush\n")},
		session.Chunk{Stream: session.Stdout, Time: now.Add(-19 * time.Minute), Data: []byte("--- \x1b[1;31mFAIL\x1b[0m: TestFlush (1.20s)\n\x1b[38:2::255:95:95mFAIL\tgithub.com/example/ws\t1.204s\n")},
	))
	must(f.AddExecution(session.Execution{ID: "x0000003cdefab", Session: "alpha", Argv: []string{"/bin/sh", "-c", "./serve --port 8080"}, By: "ssh:alice",
		State: session.ExecRunning, StartedAt: now.Add(-5 * time.Minute), StdoutBytes: 96},
		session.Chunk{Stream: session.Stdout, Time: now.Add(-5 * time.Minute), Data: []byte("listening on :8080\n")},
		session.Chunk{Stream: session.Stdout, Time: now.Add(-4 * time.Minute), Data: []byte("GET / 200 1.2ms\n")},
	))
	must(f.AddExecution(session.Execution{ID: "x0000004defabc", Session: "alpha", Argv: []string{"/bin/sh", "-c", "rsync -a big/ /workspace/big"}, By: "cli",
		State: session.ExecLost, StartedAt: now.Add(-2 * time.Hour), EndedAt: now.Add(-119 * time.Minute), StdoutBytes: 0, StderrBytes: 0}))

	mt := now.Add(-26 * time.Hour)
	must(f.AddFile("alpha", "README.md", []byte("# alpha\n\nA scratch project.\n\n\tIndented with a tab.\n"), mt))
	must(f.AddFile("alpha", "go.mod", []byte("module example.com/alpha\n\ngo 1.26\n"), mt))
	must(f.AddFile("alpha", "src/main.go", []byte("package main\n\nfunc main() {}\n"), mt))
	must(f.AddFile("alpha", "src/util/strings.go", []byte("package util\n"), mt))
	must(f.AddFile("alpha", "bin/tool", []byte("\x7fELF\x02\x01\x01\x00\x00\x00binary"), mt))
	must(f.AddDir("alpha", "empty", mt))
	must(f.Note("alpha", session.EventFlush, "flushed 4194304 bytes"))
	return f
}

// must panics on a fixture that does not fit the fake's rules.
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// harness is a root model driven like a program, at a fixed size, clock
// and colour profile.
type harness struct {
	t   *testing.T
	f   *sessiontest.Fake
	m   *Model
	d   *uitest.Driver
	w   int
	h   int
	pro colorprofile.Profile
}

func newHarness(t *testing.T, f *sessiontest.Fake, opts Options) *harness {
	t.Helper()
	return newHarnessOn(t, f, f, opts)
}

// newHarnessOn is newHarness with the model given svc, which serves f's
// sessions (f with more methods: a fleet's host list).
func newHarnessOn(t *testing.T, f *sessiontest.Fake, svc session.Service, opts Options) *harness {
	t.Helper()
	if opts.Context == nil {
		opts.Context = t.Context()
	}
	t.Cleanup(func() { f.Close() })
	m := newModel(svc, opts)
	m.c.Now = func() time.Time { return now }
	h := &harness{t: t, f: f, m: m, w: 100, h: 30, pro: colorprofile.Ascii}
	h.d = uitest.NewDriver(m)
	t.Cleanup(h.d.Close)
	h.d.Send(tea.WindowSizeMsg{Width: h.w, Height: h.h}, tea.BackgroundColorMsg{Color: blackBG{}}, tea.ColorProfileMsg{Profile: h.pro})
	if !h.d.WaitFor(func() bool { return m.sessions.Len() == len(mustList(t, f)) }, 2*time.Second) {
		t.Fatalf("sessions did not arrive: have %d", m.sessions.Len())
	}
	return h
}

type blackBG struct{}

func (blackBG) RGBA() (r, g, b, a uint32) { return 0, 0, 0, 0xffff }

func mustList(t *testing.T, f *sessiontest.Fake) []session.Session {
	ss, err := f.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// press sends keys (by name) and settles.
func (h *harness) press(names ...string) {
	h.t.Helper()
	for _, n := range names {
		h.d.Send(keys.Key(n))
	}
}

// typeText types literal text (into a focused input).
func (h *harness) typeText(s string) {
	var msgs []tea.Msg
	for _, k := range uitest.Type(s) {
		msgs = append(msgs, k)
	}
	h.d.Send(msgs...)
}

func (h *harness) resize(w, hh int) {
	h.w, h.h = w, hh
	h.d.Send(tea.WindowSizeMsg{Width: w, Height: hh})
}

// screen renders the view as plain text.
func (h *harness) screen() string {
	return plain(h.m.Render())
}

func plain(s string) string {
	var b strings.Builder
	w := colorprofile.Writer{Forward: &b, Profile: colorprofile.NoTTY}
	fmt.Fprint(&w, s)
	return b.String()
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	if !h.d.WaitFor(cond, 3*time.Second) {
		h.t.Fatalf("timed out waiting for %s; screen:\n%s", what, h.screen())
	}
}

func (h *harness) flash() string {
	_, t := h.m.Flash()
	return t
}

func lipglossWidth(s string) int { return ansi.StringWidth(s) }
