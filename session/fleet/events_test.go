package fleet

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// cutProxy passes TCP to an address until cut: then it closes every
// connection and closes new ones at once, until mend. It drops one
// client's connection to etcd while the others keep theirs.
type cutProxy struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	cut  bool
	open map[net.Conn]bool
	wg   sync.WaitGroup
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to, open: map[net.Conn]bool{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.open[c], p.open[up] = true, true
		p.mu.Unlock()
		for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
			p.wg.Go(func() {
				io.Copy(pair[0], pair[1])
				pair[0].Close()
				pair[1].Close()
			})
		}
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.open {
			c.Close()
		}
		clear(p.open)
	}
}

// fleetWriter writes a fleet's keys as hosts and placement do.
type fleetWriter struct {
	t   *testing.T
	cli *clientv3.Client
}

func (w fleetWriter) do(ops ...clientv3.Op) int64 {
	w.t.Helper()
	r, err := w.cli.Txn(ctxT(w.t)).Then(ops...).Commit()
	if err != nil {
		w.t.Fatal(err)
	}
	return r.Header.Revision
}

func (w fleetWriter) join(h string, draining bool) int64 {
	return w.do(clientv3.OpPut(hostKey(h), mustJSON(HostRecord{ID: h, Addr: h + ":7000", CPUs: 4, Draining: draining})))
}

func (w fleetWriter) own(s, h string) int64 {
	return w.do(clientv3.OpPut(specKey(s), `{}`), clientv3.OpPut(ownerKey(s), mustJSON(Owner{Host: h})),
		clientv3.OpPut(allocKey(h), mustJSON(Alloc{Sessions: 1})))
}

// shown is an EventFleet as the tests compare it.
func shown(ev session.Event) string {
	fc := ev.Fleet
	s := fmt.Sprintf("%s %s %s", ev.Name, fc.Change, fc.Host)
	if fc.From != "" {
		s += " from " + fc.From
	}
	if fc.Relisted {
		s += " relisted"
	}
	return strings.TrimSpace(s)
}

// next reads fleet events until one at revision rev or later, failing
// after within.
func nextUntil(t *testing.T, ch <-chan fleetEvent, rev int64, within time.Duration) []session.Event {
	t.Helper()
	var got []session.Event
	deadline := time.After(within)
	for len(got) == 0 || got[len(got)-1].Rev < rev {
		select {
		case fe, ok := <-ch:
			if !ok {
				t.Fatalf("the follow ended after %v", got)
			}
			if fe.ev != nil {
				got = append(got, *fe.ev)
			}
		case <-deadline:
			t.Fatalf("no event at revision %d after %s; got %v", rev, within, got)
		}
	}
	return got
}

// nextN reads n fleet events, failing after within.
func nextN(t *testing.T, ch <-chan fleetEvent, n int, within time.Duration) []session.Event {
	t.Helper()
	var got []session.Event
	deadline := time.After(within)
	for len(got) < n {
		select {
		case fe, ok := <-ch:
			if !ok {
				t.Fatalf("the follow ended after %v", got)
			}
			if fe.ev != nil {
				got = append(got, *fe.ev)
			}
		case <-deadline:
			t.Fatalf("%d events after %s, want %d: %v", len(got), within, n, got)
		}
	}
	return got
}

// checkFleetOrder checks revision order and that nothing comes twice.
func checkFleetOrder(t *testing.T, evs []session.Event) {
	t.Helper()
	seen := map[string]bool{}
	for i, ev := range evs {
		if ev.Kind != session.EventFleet || ev.Fleet == nil || ev.Rev == 0 {
			t.Errorf("event %d %+v: want a fleet event with its revision", i, ev)
			continue
		}
		if i > 0 && ev.Rev < evs[i-1].Rev {
			t.Errorf("event %d %q@%d after @%d: out of revision order", i, shown(ev), ev.Rev, evs[i-1].Rev)
		}
		id := fmt.Sprintf("%s@%d", shown(ev), ev.Rev)
		if seen[id] {
			t.Errorf("%s shown twice", id)
		}
		seen[id] = true
	}
}

func shownAll(evs []session.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, shown(ev))
	}
	return out
}

// A fleet follower shows placements, moves, releases and hosts coming
// and going, in revision order and once each, across its etcd
// connection being dropped while etcd compacts the revisions it missed;
// a follower resumed after a revision shows exactly what came after it,
// or, that revision compacted, the fleet as it is, marked relisted.
func TestFleetEventsAcrossDropAndCompaction(t *testing.T) {
	t.Parallel()
	e := newRestartable(t)
	w := fleetWriter{t, dial(t, []string{e.clientURL})}
	proxy := newCutProxy(t, strings.TrimPrefix(e.clientURL, "http://"))
	r := NewRouter(dial(t, []string{proxy.url()}), RouterConfig{Self: "door"})
	defer r.Close()

	w.join("h1", false)
	w.own("old", "h1")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ch, err := r.followFleet(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.join("h2", false)
	w.own("a", "h1")
	w.do(clientv3.OpPut(ownerKey("a"), mustJSON(Owner{Host: "h2"})))
	w.join("h2", false) // a refresh: nothing to show
	mark := w.join("h2", true)
	got := nextUntil(t, ch, mark, 10*time.Second)
	want := []string{"joined h2", "a placed h1", "a moved h2 from h1", "draining h2"}
	if fmt.Sprint(shownAll(got)) != fmt.Sprint(want) {
		t.Errorf("before the drop:\n got %q\nwant %q", shownAll(got), want)
	}

	// The follower's connection drops; the fleet changes and etcd
	// compacts those changes away before it is back.
	proxy.setCut(true)
	w.own("b", "h2")                                                 // made in the gap, shown relisted
	w.do(clientv3.OpPut(ownerKey("a"), mustJSON(Owner{Host: "h1"}))) // moved back in the gap
	w.do(clientv3.OpDelete(sessionsDir+"old/", clientv3.WithPrefix()))
	w.own("gone", "h1")
	w.do(clientv3.OpDelete(sessionsDir+"gone/", clientv3.WithPrefix())) // made and gone in the gap: never shown
	w.do(clientv3.OpDelete(hostKey("h2")))
	now := w.do(clientv3.OpPut(seenKey("h2"), mustJSON(HostRecord{ID: "h2", Left: true})))
	if _, err := w.cli.Compact(ctxT(t), now); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the client tries again, and is refused, while cut
	proxy.setCut(false)
	got = append(got, nextN(t, ch, 5, 30*time.Second)...)
	last := w.own("c", "h1")
	got = append(got, nextUntil(t, ch, last, 10*time.Second)...)
	checkFleetOrder(t, got)
	tail := shownAll(got[len(want):])
	// Relisted: the keys changed in revision order, then those gone
	// (by key) at the list's revision.
	wantTail := []string{"b placed h2 relisted", "a moved h1 from h2 relisted", "left h2 relisted",
		"lost h2 relisted", "old released h1 relisted", "c placed h1"}
	if fmt.Sprint(tail) != fmt.Sprint(wantTail) {
		t.Errorf("after the drop and compaction:\n got %q\nwant %q", tail, wantTail)
	}

	// Resumed, through another front door, after a revision etcd still
	// has: exactly what came after it.
	r2 := NewRouter(w.cli, RouterConfig{Self: "door2"})
	defer r2.Close()
	w.do(clientv3.OpDelete(sessionsDir+"c/", clientv3.WithPrefix()))
	end := w.join("h3", false)
	ch2, err := r2.followFleet(ctx, last)
	if err != nil {
		t.Fatal(err)
	}
	got2 := nextUntil(t, ch2, end, 10*time.Second)
	checkFleetOrder(t, got2)
	if want := []string{"c released h1", "joined h3"}; fmt.Sprint(shownAll(got2)) != fmt.Sprint(want) {
		t.Errorf("resumed after %d: got %q, want %q", last, shownAll(got2), want)
	}

	// Resumed after a compacted revision: the fleet as it is, relisted.
	ch3, err := r2.followFleet(ctx, mark)
	if err != nil {
		t.Fatal(err)
	}
	got3 := nextUntil(t, ch3, end, 10*time.Second)
	checkFleetOrder(t, got3)
	if want := []string{"joined h1 relisted", "b placed h2 relisted", "a placed h1 relisted", "left h2 relisted", "joined h3 relisted"}; fmt.Sprint(shownAll(got3)) != fmt.Sprint(want) {
		t.Errorf("resumed after a compacted revision: got %q, want the fleet as it is %q", shownAll(got3), want)
	}

	// A revision ahead of etcd's is refused, not waited for.
	if _, err := r2.followFleet(ctx, end+1000); err == nil {
		t.Error("a follow from a future revision was not refused")
	}
}
