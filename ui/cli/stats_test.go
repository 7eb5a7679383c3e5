package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

func TestStatsNoStream(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	for _, s := range []session.Session{
		{Name: "busy", State: session.StateRunning, CPUs: 2, MemoryMiB: 512, DiskBytes: 4 << 30},
		{Name: "idle", State: session.StateRunning, CPUs: 1, MemoryMiB: 1024, DiskBytes: 4 << 30},
		{Name: "off", State: session.StateStopped, CPUs: 1, MemoryMiB: 512, DiskBytes: 4 << 30},
	} {
		if err := w.fake.AddSession(s); err != nil {
			t.Fatal(err)
		}
	}
	w.fake.Update("busy", func(s *session.Session) {
		s.MemUsedBytes = 128 << 20
		s.Live = &session.Live{CPUPercent: 97.5, GuestCPUPercent: 99, RSSBytes: 300 << 20, WorkspaceWriteBps: 1 << 20, CPUSeconds: 40}
	})
	golden(t, "stats", w.sh(t, "stats", "--no-stream"))
	golden(t, "stats-all", w.sh(t, "stats", "--no-stream", "--all"))

	var rows []cli.StatsRow
	if err := json.Unmarshal([]byte(w.sh(t, "stats", "busy", "off", "--no-stream", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Name != "busy" || rows[0].Live == nil || rows[0].Live.CPUPercent != 97.5 || rows[0].MemoryLimitBytes != 512<<20 ||
		rows[1].Name != "off" || rows[1].Live != nil {
		t.Fatalf("stats --json = %+v", rows)
	}
	for _, c := range []tc{
		{name: "unknown", args: []string{"stats", "nope", "--no-stream"}, code: 1, stderr: "berth: session \"nope\": not found\n"},
		{name: "bad name", args: []string{"stats", "Bad", "--no-stream"}, code: 1, stderr: "~invalid session name"},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t, w.run(t.Context(), cli.Env{}, c.args...)) })
	}
}

// TestStatsStream: the live table redraws as figures change, one JSON
// array a line.
func TestStatsStream(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.fake.AddSession(session.Session{Name: "busy", State: session.StateRunning, CPUs: 1, MemoryMiB: 512})
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan result, 1)
	go func() {
		r := w.run(ctx, cli.Env{Stdout: pw}, "stats", "--json")
		pw.Close()
		done <- r
	}()
	lines := bufio.NewScanner(pr)
	next := func() []cli.StatsRow {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("stats ended: %v", lines.Err())
		}
		var rows []cli.StatsRow
		if err := json.Unmarshal(lines.Bytes(), &rows); err != nil {
			t.Fatalf("line %q: %v", lines.Text(), err)
		}
		return rows
	}
	if rows := next(); len(rows) != 1 || rows[0].Live != nil {
		t.Fatalf("first table: %+v", rows)
	}
	w.fake.AddSample("busy", session.Sample{CPUPercent: 42})
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows := next()
		if len(rows) == 1 && rows[0].Live != nil && rows[0].Live.CPUPercent == 42 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no table with the new figures: %+v", rows)
		}
	}
	cancel()
	go io.Copy(io.Discard, pr)
	if r := <-done; r.code != 0 {
		t.Fatalf("stats: exit %d %s", r.code, r.stderr)
	}
}

// TestEventsFollowJSON: every event is one JSON line, in order, the
// timeline first (of every session, merged in time, without a name) and
// then the stream without a repeat or a gap.
func TestEventsFollowJSON(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		only string // every event is of this session ("" any)
		want string // the notes, in order
	}{
		{"one session", []string{"events", "demo", "--follow", "--json"}, "demo",
			"before|just before|na|nc|ne|ng|ni|nk|nm|no|nq|ns|last"},
		{"all sessions", []string{"events", "--follow", "--json"}, "",
			"before|other before|just before|na|nb|nc|nd|ne|nf|ng|nh|ni|nj|nk|nl|nm|nn|no|np|nq|nr|ns|nt|last"},
		{"all sessions, the last 2 first", []string{"events", "--follow", "--json", "-n", "2"}, "",
			"other before|just before|na|nb|nc|nd|ne|nf|ng|nh|ni|nj|nk|nl|nm|nn|no|np|nq|nr|ns|nt|last"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A world each: the notes of one case are no backlog of the next.
			w := newWorld(t, sessiontest.Options{})
			w.fake.AddSession(session.Session{Name: "demo", State: session.StateRunning, CPUs: 1, MemoryMiB: 512})
			w.fake.AddSession(session.Session{Name: "other", State: session.StateRunning, CPUs: 1, MemoryMiB: 512})
			w.fake.Note("demo", session.EventNote, "before")
			w.fake.Note("other", session.EventNote, "other before")
			w.fake.Note("demo", session.EventNote, "just before")
			pr, pw := io.Pipe()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan result, 1)
			watches := w.fake.Calls("Watch")
			go func() {
				r := w.run(ctx, cli.Env{Stdout: pw}, c.args...)
				pw.Close()
				done <- r
			}()
			// Events during the stream, on both sessions; the last one tells the
			// reader it has everything.
			go func() {
				for w.fake.Calls("Watch") == watches {
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(50 * time.Millisecond) // the watcher registers right after the call is counted
				for i := range 20 {
					w.fake.Note([]string{"demo", "other"}[i%2], session.EventNote, "n"+string(rune('a'+i)))
				}
				w.fake.Note("demo", session.EventNote, "last")
			}()
			lines := bufio.NewScanner(pr)
			var got []session.Event
			for lines.Scan() {
				var ev session.Event
				if err := json.Unmarshal(lines.Bytes(), &ev); err != nil {
					t.Fatalf("line %q: %v", lines.Text(), err)
				}
				got = append(got, ev)
				if ev.Message == "last" {
					break
				}
			}
			cancel()
			go io.Copy(io.Discard, pr)
			if r := <-done; r.code != 0 {
				t.Fatalf("exit %d %s", r.code, r.stderr)
			}
			var msgs []string
			last := map[string]uint64{} // seqs count per session
			for i, ev := range got {
				if ev.Seq <= last[ev.Name] {
					t.Errorf("event %d of %s: seq %d after %d: out of order or repeated", i, ev.Name, ev.Seq, last[ev.Name])
				}
				last[ev.Name] = ev.Seq
				if i > 0 && ev.Time.Before(got[i-1].Time) {
					t.Errorf("event %d (%s) at %s, before the one above it", i, ev.Message, ev.Time)
				}
				if c.only != "" && ev.Name != c.only {
					t.Errorf("event of %s in a follow of %s", ev.Name, c.only)
				}
				if ev.Kind == session.EventNote {
					msgs = append(msgs, ev.Message)
				}
			}
			if strings.Join(msgs, "|") != c.want {
				t.Errorf("notes %q, want %q", strings.Join(msgs, "|"), c.want)
			}
		})
	}
	w := newWorld(t, sessiontest.Options{})
	tc{args: []string{"events"}, code: 2, stderr: "~missing NAME"}.check(t, w.run(t.Context(), cli.Env{}, "events"))
	tc{args: []string{"events", "demo", "--stats"}, code: 2, stderr: "~--stats needs --follow"}.check(t, w.run(t.Context(), cli.Env{}, "events", "demo", "--stats"))
	tc{args: []string{"events", "demo", "--since-rev", "5"}, code: 2, stderr: "~--since-rev needs --follow"}.check(t, w.run(t.Context(), cli.Env{}, "events", "demo", "--since-rev", "5"))
	tc{args: []string{"events", "--follow", "--since-rev", "5"}, code: 1, stderr: "~this berth is not in a fleet, so its events have no revisions (leave out --since-rev)"}.check(t, w.run(t.Context(), cli.Env{}, "events", "--follow", "--since-rev", "5"))
}
