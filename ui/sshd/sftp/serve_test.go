package sftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

// Serve returns ctx's error when ctx ends, whatever the stream is doing,
// and releases every handle: staged uploads dropped, other files closed,
// calls in flight ended.
func TestServeEndsWithItsContext(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(fx *fixture, r *raw)
	}{
		{"before INIT", func(*fixture, *raw) {}},
		{"idle", func(_ *fixture, r *raw) { r.init() }},
		{"handles open", func(fx *fixture, r *raw) {
			r.init()
			r.open("f", fxfRead)
			r.open("f", fxfWrite)
			h := r.open("f", fxfWrite|fxfCreat|fxfTrunc)
			r.ok("write", fxpWrite, h, uint64(0), "staged")
			r.opendir("/workspace")
		}},
		{"a READ hangs", func(fx *fixture, r *raw) {
			r.init()
			h := r.open("f", fxfRead)
			r.open("f", fxfWrite|fxfCreat|fxfTrunc)
			fx.fake.Hang("File.ReadAt")
			r.send(fxpRead, h, uint64(0), uint32(10))
			waitFor(fx.t, "the READ to reach the service", func() bool { return fx.fake.Calls("File.ReadAt") == 1 })
		}},
		{"a WRITE hangs", func(fx *fixture, r *raw) {
			r.init()
			h := r.open("f", fxfWrite)
			fx.fake.Hang("File.WriteAt")
			r.send(fxpWrite, h, uint64(0), "x")
			waitFor(fx.t, "the WRITE to reach the service", func() bool { return fx.fake.Calls("File.WriteAt") == 1 })
			// A request behind it waits for it (a barrier), then for
			// the stream.
			r.send(fxpStat, "f")
		}},
		{"a STAT hangs", func(fx *fixture, r *raw) {
			r.init()
			r.open("f", fxfWrite|fxfCreat|fxfTrunc)
			fx.fake.Hang("Stat")
			r.send(fxpLstat, ".")
			waitFor(fx.t, "the LSTAT to reach the service", func() bool { return fx.fake.Calls("Stat") == 1 })
		}},
		{"writes in flight, more waiting", func(fx *fixture, r *raw) {
			r.init()
			h := r.open("f", fxfWrite)
			fx.fake.Hang("File.WriteAt")
			for i := range DefaultMaxInflight + 1 {
				r.send(fxpWrite, h, uint64(i), "x")
			}
			waitFor(fx.t, "the writes to reach the service", func() bool { return fx.fake.Calls("File.WriteAt") == DefaultMaxInflight })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "old")
			st := fx.serve(Server{})
			r := st.raw()
			tc.setup(fx, r)
			st.cancel()
			if err := st.wait(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Serve = %v; want context.Canceled", err)
			}
			fx.waitReleased()
			fx.wantContent("f", "old")
			// The client's end sees the stream closed.
			for range r.replies {
			}
		})
	}
}

// A client that goes away leaves its handles released and Serve
// returns nil; its in-place writes are there, its staged uploads are
// not.
func TestClientGoesAway(t *testing.T) {
	fx := newFixture(t)
	fx.file("a", "old a")
	fx.file("b", "old b")
	st := fx.serve(Server{})
	r := st.raw()
	r.init()
	var handles []string
	for i := range 20 {
		handles = append(handles, r.open(fmt.Sprintf("d%d", i), fxfWrite|fxfCreat|fxfTrunc))
		r.opendir(".")
	}
	ha := r.open("a", fxfWrite)
	hb := r.open("b", fxfWrite|fxfCreat|fxfTrunc)
	r.ok("write a", fxpWrite, ha, uint64(0), "new")
	r.ok("write b", fxpWrite, hb, uint64(0), "new")
	for _, h := range handles {
		r.ok("write", fxpWrite, h, uint64(0), "dropped")
	}
	// WRITEs still in flight when the client goes: done or not, the
	// file is closed after them.
	for i := range 8 {
		r.send(fxpWrite, ha, uint64(10+i), "z")
	}
	st.conn.Close()
	// nil, or the failure to answer the writes in flight.
	if err := st.wait(); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Serve = %v after the client went away; want nil or a failed reply", err)
	}
	fx.waitReleased()
	got, err := fx.content("a")
	if err != nil || len(got) < 5 || got[:5] != "new a" {
		t.Fatalf("a holds %q, %v; want the in-place write (%q…)", got, err, "new a")
	}
	fx.wantContent("b", "old b")
	for i := range 20 {
		fx.wantMissing(fmt.Sprintf("d%d", i))
	}
}

// A stream that fails to write a reply ends Serve with that error.
func TestServeEndsWhenRepliesFail(t *testing.T) {
	fx := newFixture(t)
	fx.file("f", "old")
	srv := Server{Files: fx.fake, Handles: fx.fake, Name: testSession}
	in := &scripted{reqs: [][]byte{build(fxpInit, uint32(3))}, failAfter: 1}
	for i := range 3 {
		in.reqs = append(in.reqs, build(fxpStat, uint32(i+1), "f"))
	}
	err := srv.Serve(t.Context(), in)
	if err == nil || !errors.Is(err, errWriteFailed) {
		t.Fatalf("Serve = %v; want the write's error", err)
	}
	if in.writes != 2 {
		t.Fatalf("%d replies written; want VERSION and the one that failed", in.writes)
	}
}

var errWriteFailed = errors.New("the channel is gone")

// scripted is a stream reading reqs and failing writes after failAfter.
type scripted struct {
	reqs      [][]byte
	cur       []byte
	writes    int
	failAfter int
}

func (s *scripted) Read(b []byte) (int, error) {
	for len(s.cur) == 0 {
		if len(s.reqs) == 0 {
			return 0, io.EOF
		}
		s.cur, s.reqs = s.reqs[0], s.reqs[1:]
	}
	n := copy(b, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}

func (s *scripted) Write(b []byte) (int, error) {
	s.writes++
	if s.writes > s.failAfter {
		return 0, errWriteFailed
	}
	return len(b), nil
}

func (s *scripted) Close() error { return nil }

// A client that goes away while a call hangs (a wedged guest) leaves
// Serve waiting for it only until Serve's ctx ends: then the call is
// ended, the handles released and Serve returns.
func TestServeEndsWithItsContextAfterTheClientWent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(fx *fixture, r *raw)
		// wait is what shows Serve is releasing, after the client went.
		wait func(fx *fixture) bool
	}{
		{"a READ hangs", func(fx *fixture, r *raw) {
			h := r.open("f", fxfRead)
			r.open("f", fxfWrite|fxfCreat|fxfTrunc) // dropped first: shows the release began
			fx.fake.Hang("File.ReadAt")
			r.send(fxpRead, h, uint64(0), uint32(10))
			waitFor(fx.t, "the READ to reach the service", func() bool { return fx.fake.Calls("File.ReadAt") == 1 })
		}, func(fx *fixture) bool { return fx.fake.OpenFiles(testSession) == 1 }},
		{"a CLOSE of a file left open hangs", func(fx *fixture, r *raw) {
			r.open("f", fxfWrite)
			fx.fake.Hang("File.Close")
		}, func(fx *fixture) bool { return fx.fake.Calls("File.Close") == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.file("f", "old")
			st := fx.serve(Server{})
			r := st.raw()
			r.init()
			tc.setup(fx, r)
			st.conn.Close()
			waitFor(t, "Serve to release the handles", func() bool { return tc.wait(fx) })
			st.cancel()
			if err := st.wait(); !errors.Is(err, context.Canceled) {
				t.Fatalf("Serve = %v; want context.Canceled", err)
			}
			fx.waitReleased()
			fx.wantContent("f", "old")
		})
	}
}
