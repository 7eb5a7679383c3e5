package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// collect reads changes from ch until want is true of what it has, or
// fails after within.
func collect(t *testing.T, ch <-chan Change, got []Change, within time.Duration, want func([]Change) bool) []Change {
	t.Helper()
	deadline := time.After(within)
	for !want(got) {
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatalf("the watch ended; got %+v", got)
			}
			got = append(got, c)
		case <-deadline:
			t.Fatalf("after %s: %+v", within, got)
		}
	}
	return got
}

func has(key string, rev int64) func([]Change) bool {
	return func(cs []Change) bool {
		for _, c := range cs {
			if c.Key == key && c.Rev == rev {
				return true
			}
		}
		return false
	}
}

// checkOrder checks that changes come in revision order and that no
// (key, revision) comes twice.
func checkOrder(t *testing.T, cs []Change) {
	t.Helper()
	seen := map[string]bool{}
	for i, c := range cs {
		if i > 0 && c.Rev < cs[i-1].Rev {
			t.Errorf("change %d %s@%d after %s@%d: out of revision order", i, c.Key, c.Rev, cs[i-1].Key, cs[i-1].Rev)
		}
		id := fmt.Sprintf("%s@%d", c.Key, c.Rev)
		if seen[id] {
			t.Errorf("change %s reported twice", id)
		}
		seen[id] = true
	}
}

// A watch reports every change in revision order, once, across etcd
// going away and coming back (the same watch, reconnecting), including a
// transaction's changes that share one revision.
func TestWatchAcrossReconnect(t *testing.T) {
	t.Parallel()
	e := newRestartable(t)
	cli, err := Dial(e.clientURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	put := func(k string) int64 {
		r, err := cli.Put(ctxT(t), Prefix+"t/"+k, k)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	put("before")
	ch := NewWatcher(cli, Prefix+"t/", 0, nil).Watch(ctx)
	got := collect(t, ch, nil, 10*time.Second, func(cs []Change) bool { return len(cs) == 1 })
	if !got[0].Relisted || got[0].Key != Prefix+"t/before" {
		t.Errorf("first change %+v, want the existing key, relisted", got[0])
	}
	var revs []int64
	for i := range 3 {
		revs = append(revs, put(fmt.Sprint("a", i)))
	}
	tx, err := cli.Txn(ctxT(t)).Then(clientv3.OpPut(Prefix+"t/x1", "1"), clientv3.OpPut(Prefix+"t/x2", "2"), clientv3.OpDelete(Prefix+"t/a0")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	got = collect(t, ch, got, 10*time.Second, has(Prefix+"t/a0", tx.Header.Revision))
	e.stop()
	e.start()
	for i := range 3 {
		revs = append(revs, put(fmt.Sprint("b", i)))
	}
	last := revs[len(revs)-1]
	got = collect(t, ch, got, 20*time.Second, has(Prefix+"t/b2", last))
	checkOrder(t, got)
	for _, rev := range revs {
		n := 0
		for _, c := range got {
			if c.Rev == rev {
				n++
			}
		}
		if n != 1 {
			t.Errorf("revision %d reported %d times", rev, n)
		}
	}
	n := 0
	for _, c := range got {
		if c.Rev == tx.Header.Revision {
			n++
		}
	}
	if n != 3 {
		t.Errorf("the transaction's 3 changes came %d times", n)
	}
}

// A watch made again after etcd compacted the revisions it needed lists
// the keys again: it reports the keys changed since its last change and
// those gone, once each, in revision order, and then watches on.
func TestWatchAcrossCompaction(t *testing.T) {
	t.Parallel()
	cli := dial(t, []string{newRestartable(t).clientURL})
	p := Prefix + "c/"
	put := func(k, v string) int64 {
		r, err := cli.Put(ctxT(t), p+k, v)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	del := func(k string) int64 {
		r, err := cli.Delete(ctxT(t), p+k)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	w := NewWatcher(cli, p, 0, nil)
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	ch := w.Watch(ctx1)
	put("k1", "1")
	put("k2", "1")
	r3 := put("k3", "1")
	got := collect(t, ch, nil, 10*time.Second, has(p+"k3", r3))
	cancel1()
	for range ch {
	}

	// While no watch runs: changes, then a compaction past them.
	r2 := put("k2", "2")
	put("k5", "1")
	del("k5") // made and gone in the gap: never reported
	r4 := put("k4", "1")
	del("k3")
	now := put("k6", "1")
	if _, err := cli.Compact(ctxT(t), now); err != nil {
		t.Fatal(err)
	}

	ch = w.Watch(ctxT(t))
	after := len(got)
	got = collect(t, ch, got, 10*time.Second, func(cs []Change) bool { return len(cs) >= after+4 })
	r7 := put("k7", "1")
	got = collect(t, ch, got, 10*time.Second, has(p+"k7", r7))
	checkOrder(t, got)
	var tail []string
	for _, c := range got[after:] {
		tail = append(tail, fmt.Sprintf("%s deleted=%v relisted=%v", c.Key[len(p):], c.Deleted, c.Relisted))
	}
	want := []string{"k2 deleted=false relisted=true", "k4 deleted=false relisted=true", "k6 deleted=false relisted=true",
		"k3 deleted=true relisted=true", "k7 deleted=false relisted=false"}
	if fmt.Sprint(tail) != fmt.Sprint(want) {
		t.Errorf("after the compaction:\n got %q\nwant %q", tail, want)
	}
	if got[after].Rev != r2 || got[after+1].Rev != r4 {
		t.Errorf("relisted revisions %d %d, want %d %d", got[after].Rev, got[after+1].Rev, r2, r4)
	}
}
