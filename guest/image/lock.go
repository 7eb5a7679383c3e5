package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Caches are shared: by the builds of one daemon, by several daemons
// with their own data directories and the default cache directory, and
// by `go test` binaries. What one build writes into a cache either
// appears whole (written aside, then renamed or linked in) or is made
// under a lock file in the cache, an exclusive flock(2) that the kernel
// drops when its holder exits, however it exits.

// lockPoll bounds how long a waiting build sleeps between attempts. A
// lock is held for seconds to minutes (a download, mmdebstrap), so
// polling costs nothing, and unlike a blocking flock it ends the moment
// the build's context does.
const lockPoll = 250 * time.Millisecond

// lockFile takes the exclusive lock on path, creating the file. While
// another holder has it, it calls waiting once (to say so) and retries
// until it gets the lock or ctx ends. The returned func releases it.
func lockFile(ctx context.Context, path string, waiting func()) (func(), error) {
	said := false
	delay := 5 * time.Millisecond
	for {
		unlock, err := tryLockFile(path)
		if err == nil {
			return unlock, nil
		}
		if !errors.Is(err, errLocked) {
			return nil, err
		}
		if !said && waiting != nil {
			waiting()
			said = true
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, lockPoll)
	}
}

// errLocked is a lock another holder has.
var errLocked = errors.New("locked by another build")

// tryLockFile takes the lock on path if nobody holds it, or fails with
// errLocked.
func tryLockFile(path string) (func(), error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, errLocked
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// A holder may remove the lock file before it lets go (pruning
		// does): a lock on a file no longer under the name locks
		// nothing, so start again with the file that is.
		held, err1 := f.Stat()
		named, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, named) {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		f.Close()
	}
}

// waitingFor is the line a build shows while another holds what it
// needs.
func waitingFor(what string) string { return "waiting for another build using " + what }
