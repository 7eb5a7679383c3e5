package store

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// BenchmarkAppendOutput measures output ingest of 64 KiB chunks: one
// stream sending one or 16 chunks a call, and four streams (execs) at once.
// Past 256 MiB of a session's output every append also trims, as in a long
// running command. BenchmarkBadgerSet is what storing the data in badger
// itself, as before segments, could reach.
func BenchmarkAppendOutput(b *testing.B) {
	data := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, c := range []struct{ streams, per int }{{1, 1}, {1, 4}, {1, 16}, {4, 1}} {
		b.Run(fmt.Sprintf("streams=%d/chunks=%d", c.streams, c.per), func(b *testing.B) {
			s := openTest(b, b.TempDir())
			if err := s.PutSession(Session{Name: "s", State: "running"}); err != nil {
				b.Fatal(err)
			}
			chunks := make([]Chunk, c.per)
			for i := range chunks {
				chunks[i] = Chunk{Stream: Stdout, Data: data}
			}
			ids := make([]string, c.streams)
			for i := range ids {
				ids[i] = fmt.Sprintf("e%d", i)
				if err := s.PutExec(Exec{ID: ids[i], Session: "s", Argv: []string{"yes"}, State: "running", StartedAt: time.Now()}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(c.per * len(data)))
			b.ResetTimer()
			var n atomic.Int64
			var wg sync.WaitGroup
			for _, id := range ids {
				wg.Go(func() {
					var off int64
					for n.Add(1) <= int64(b.N) {
						off += int64(c.per * len(data))
						if _, err := s.AppendOutput(id, chunks, off, 0); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// BenchmarkBadgerSet is what badger itself sustains with the store's
// options: one 64 KiB value a transaction (in the value log), nothing else.
func BenchmarkBadgerSet(b *testing.B) {
	db, err := badger.Open(badgerOptions(b.TempDir(), testLogger(b)))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	data := make([]byte, 64<<10)
	b.SetBytes(int64(len(data)))
	var seq uint64
	for b.Loop() {
		seq++
		k := chunkKey("e", seq)
		if err := db.Update(func(txn *badger.Txn) error { return txn.Set(k, data) }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListSessions lists 1,000 sessions with realistic records.
func BenchmarkListSessions(b *testing.B) {
	s := openTest(b, b.TempDir())
	for i := range 1000 {
		sess := Session{Name: fmt.Sprintf("session-%04d", i), State: "running", Image: "debian-13", VMM: "qemu",
			Accel: "kvm", CPUs: 2, MemoryMiB: 2048, DiskBytes: 10 << 30, Pid: 10000 + i, CreatedAt: t0,
			StartedAt: t0, LastActivity: t0, WorkspaceUUID: "0b8e3a52-6f7c-4c1e-9a43-2d1f0e5b7c99",
			IdleTimeout: durationp(30 * time.Minute), LastWake: 412 * time.Millisecond}
		if err := s.PutSession(sess); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		list, err := s.ListSessions()
		if err != nil || len(list) != 1000 {
			b.Fatalf("ListSessions: %d, %v", len(list), err)
		}
	}
}

// BenchmarkReadOutput replays 64 MiB of 64 KiB chunks, 64 per call.
func BenchmarkReadOutput(b *testing.B) {
	s := openTest(b, b.TempDir())
	if err := s.PutExec(Exec{ID: "e", Session: "s"}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 64<<10)
	chunks := make([]Chunk, 64)
	for i := range chunks {
		chunks[i] = Chunk{Stream: Stdout, Data: data}
	}
	for i := range 16 {
		if _, err := s.AppendOutput("e", chunks, int64(i+1)*64*int64(len(data)), 0); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(16 * 64 * int64(len(data)))
	for b.Loop() {
		for next := uint64(0); ; {
			cs, _, n, err := s.ReadOutput("e", next, 64)
			if err != nil {
				b.Fatal(err)
			}
			if len(cs) == 0 {
				break
			}
			next = n
		}
	}
}
