package fleet

import (
	"bytes"
	"encoding/json"
	"testing"
)

// Records read back from etcd come from peers: the parsers take any
// bytes without panicking, and what they accept survives a round trip
// and stays within the bounds.
func FuzzRecords(f *testing.F) {
	f.Add("a", []byte(`{"id":"a","addr":"10.0.0.1:7000","cpus":4,"mem_mib":8192,"disk_free":1,"floor":0,"images":["mini"],"since":"2026-01-01T00:00:00Z","at":"2026-01-01T00:00:00Z"}`))
	f.Add("a", []byte(`{"id":"b"}`))
	f.Add("a", []byte(`{"cpus":1,"mem_mib":2,"sessions":3}`))
	f.Add("a", []byte(`{"host":"a"}`))
	f.Add("a", []byte(`{"memory":true,"taken_at":"2026-01-01T00:00:00Z","copied_at":"2026-01-01T00:00:01Z","bytes":4096}`))
	f.Add("a", []byte(`{"host":"b","epoch":41,"op":"stop","state":"stopped","at":"2026-01-01T00:00:00Z"}`))
	f.Add("a", []byte(`{"id":"a","cpus":-1}{}`))
	f.Add("a", []byte(`{"id":"a","images":[""]}`))
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		if r, err := ParseHostRecord(key, b); err == nil {
			if r.ID != key || r.CPUs < 0 || len(r.Images) > maxImages || r.check() != nil {
				t.Fatalf("accepted %+v", r)
			}
			again, err := ParseHostRecord(key, []byte(mustJSON(r)))
			if err != nil {
				t.Fatalf("round trip: %v", err)
			}
			x, _ := json.Marshal(again)
			y, _ := json.Marshal(r)
			if !bytes.Equal(x, y) {
				t.Fatalf("round trip changed %s to %s", y, x)
			}
		}
		if a, err := ParseAlloc(b); err == nil && (a.CPUs < 0 || a.MemoryMiB < 0 || a.Sessions < 0) {
			t.Fatalf("accepted %+v", a)
		}
		if r, err := ParseReplica(b); err == nil && r.Bytes < 0 {
			t.Fatalf("accepted replica %+v", r)
		}
		if o, err := ParseOwner(b); err == nil && ValidateHostID(o.Host) != nil {
			t.Fatalf("accepted owner %+v", o)
		}
		if st, err := ParseStatus(b); err == nil && (ValidateHostID(st.Host) != nil || st.Epoch < 0 || len(st.Op) > 32) {
			t.Fatalf("accepted status %+v", st)
		}
	})
}

// A fleet follower reads every key's value from etcd: any bytes under
// any key make no panic, and an event it shows names a valid host and
// keeps the change's revision.
func FuzzFleetLog(f *testing.F) {
	f.Add("sessions/a/owner", []byte(`{"host":"h1"}`), false)
	f.Add("hosts/h1", []byte(`{"id":"h1","addr":"x:1","draining":true}`), false)
	f.Add("seen/h1", []byte(`{"id":"h1","left":true}`), false)
	f.Add("hosts/h1", []byte(nil), true)
	f.Add("sessions/a/b/owner", []byte(`{"host":"../x"}`), false)
	f.Fuzz(func(t *testing.T, key string, b []byte, deleted bool) {
		l := newFleetLog()
		for rev, c := range []Change{{Key: Prefix + key, Value: b, Rev: 1}, {Key: Prefix + key, Value: b, Deleted: deleted, Rev: 2}} {
			for _, fe := range l.apply(c) {
				if fe.rev != int64(rev+1) || (fe.ev != nil && (fe.ev.Rev != fe.rev || ValidateHostID(fe.ev.Fleet.Host) != nil)) ||
					(fe.rec != nil && fe.rec.ID != fe.host) {
					t.Fatalf("event %+v of %+v", fe, c)
				}
			}
		}
	})
}
