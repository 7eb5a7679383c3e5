package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Change is one change of a key under a watched prefix.
type Change struct {
	Key string
	// Value is the key's new value; nil when Deleted.
	Value   []byte
	Deleted bool
	// Rev is the revision of the change: the key's mod revision for a
	// put, the deleting revision for a delete (for a delete found by a
	// re-list, the list's revision).
	Rev int64
	// Relisted: the change was found by listing the keys again after
	// etcd compacted the revisions the watch needed; changes between
	// the last one reported and it were folded into it.
	Relisted bool
}

// Watcher reports the changes of the keys under a prefix in revision
// order, each (key, revision) at most once, across lost connections and
// compactions: after a lost connection it watches again from the
// revision after the last one it reported; when etcd has compacted that
// revision away, it lists the prefix again and reports every key changed
// since (and every key it reported that is gone) as Relisted changes,
// then watches on after the list's revision.
//
// One Watch runs at a time; a later Watch goes on where the last one
// stopped, so a caller that reconnects misses nothing and sees nothing
// twice.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger
	// Every revision before next is reported whole; of revision next,
	// the keys in partial are (a transaction's changes share one
	// revision, and a watch can end between them). known holds the
	// keys reported present, with their mod revisions, so a re-list can
	// say which are gone.
	next    int64
	partial map[string]bool
	known   map[string]int64
}

// NewWatcher returns a Watcher of prefix. from is the first revision to
// report; 0 begins with the keys as they are now (reported as Relisted
// changes), then their changes.
func NewWatcher(cli *clientv3.Client, prefix string, from int64, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{cli: cli, prefix: prefix, next: from, partial: map[string]bool{}, known: map[string]int64{}, log: log.With("component", "fleet-watch", "prefix", prefix)}
}

// know records key as present at mod revision rev before the first
// Watch: a Watcher made at a revision after a list of the keys at it
// (from > 0), so that a re-list can say which of them are gone.
func (w *Watcher) know(key string, rev int64) { w.known[key] = rev }

// Next is the first revision the Watcher has not reported: where a
// Watcher made again (a restarted process) would begin.
func (w *Watcher) Next() int64 { return w.next }

// Watch reports changes until ctx ends, then closes the channel. Errors
// (etcd out of reach) are retried with a backoff, never reported: a
// watch is late, never wrong.
func (w *Watcher) Watch(ctx context.Context) <-chan Change {
	out := make(chan Change)
	go func() {
		defer close(out)
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			err := w.run(ctx, out)
			if ctx.Err() != nil {
				return
			}
			w.log.Debug("watch again", "from", w.next, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}()
	return out
}

// errRelist says the watch's next revision was compacted away.
var errRelist = errors.New("compacted: list again")

// run watches from w.next until the watch ends; it lists first when
// there is no revision to start from or it was compacted away.
func (w *Watcher) run(ctx context.Context, out chan<- Change) error {
	if w.next == 0 {
		if err := w.relist(ctx, out); err != nil {
			return err
		}
	}
	// WithRequireLeader: a member cut off from its cluster ends the
	// watch instead of leaving it silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(w.next)) {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			if err := w.relist(ctx, out); err != nil {
				return err
			}
			return errRelist
		}
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			c := Change{Key: string(ev.Kv.Key), Rev: ev.Kv.ModRevision}
			if ev.Type == mvccpb.DELETE {
				c.Deleted = true
			} else {
				c.Value = ev.Kv.Value
			}
			if w.reported(c) {
				continue // reported before the watch was made again
			}
			if !w.send(ctx, out, c) {
				return ctx.Err()
			}
		}
		// etcd sends a revision's changes in one response: those up to
		// the last one's are whole.
		if n := len(resp.Events); n > 0 {
			w.done(resp.Events[n-1].Kv.ModRevision)
		}
	}
	return fmt.Errorf("watch of %s ended", w.prefix)
}

// reported says whether c was reported already.
func (w *Watcher) reported(c Change) bool {
	return c.Rev < w.next || (c.Rev == w.next && w.partial[c.Key])
}

// done records that every revision up to rev is reported whole.
func (w *Watcher) done(rev int64) {
	if rev+1 > w.next {
		w.next = rev + 1
		clear(w.partial)
	}
}

// send reports c and remembers it.
func (w *Watcher) send(ctx context.Context, out chan<- Change, c Change) bool {
	select {
	case <-ctx.Done():
		return false
	case out <- c:
	}
	if c.Deleted {
		delete(w.known, c.Key)
	} else {
		w.known[c.Key] = c.Rev
	}
	if c.Rev > w.next {
		w.next = c.Rev
		clear(w.partial)
	}
	w.partial[c.Key] = true
	return true
}

// relist lists the prefix at one revision and reports what changed since
// the last change reported: keys whose mod revision is later, in
// revision order, then keys reported before that are gone, at the list's
// revision. Then the watch goes on after the list's revision.
func (w *Watcher) relist(ctx context.Context, out chan<- Change) error {
	r, err := w.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list %s: %w", w.prefix, err)
	}
	kvs := r.Kvs
	sort.SliceStable(kvs, func(i, j int) bool { return kvs[i].ModRevision < kvs[j].ModRevision })
	present := map[string]bool{}
	for _, kv := range kvs {
		present[string(kv.Key)] = true
		c := Change{Key: string(kv.Key), Value: kv.Value, Rev: kv.ModRevision, Relisted: true}
		if rev, ok := w.known[c.Key]; (ok && rev == c.Rev) || w.reported(c) {
			continue
		}
		if !w.send(ctx, out, c) {
			return ctx.Err()
		}
	}
	var gone []string
	for k := range w.known {
		if !present[k] {
			gone = append(gone, k)
		}
	}
	sort.Strings(gone)
	for _, k := range gone {
		if !w.send(ctx, out, Change{Key: k, Deleted: true, Rev: r.Header.Revision, Relisted: true}) {
			return ctx.Err()
		}
	}
	w.done(r.Header.Revision)
	return nil
}
