package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// Change records. While a run is open the host asks the agent to record
// which paths under /workspace change, so a diff reads those alone. The
// record comes from fanotify on the workspace's whole filesystem
// (FAN_MARK_FILESYSTEM, so every writer is seen: managed commands, an SSH
// shell, sshfs, the file API) with FAN_REPORT_DFID_NAME: each event names
// the directory (by file handle) and the entry's name. Handles are turned
// into paths only when the record is read, so a directory renamed later
// is found where it is then.
//
// The record is bounded: past maxRecord distinct entries, or when the
// kernel's queue overflows, it is dropped and marked overflowed, and the
// host compares whole trees instead. Records are kept per tracker id (a
// run), at most maxTrackers, all fed by one fanotify group.

const (
	maxRecord   = guest.MaxTrackRecord
	maxTrackers = 16
	// trackMask: creation, removal, renames, writes and attribute
	// changes, of directories too.
	trackMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
		unix.FAN_MODIFY | unix.FAN_ATTRIB | unix.FAN_CLOSE_WRITE | unix.FAN_ONDIR
)

type record struct {
	since    time.Time
	keys     map[string]struct{} // a directory's handle key, then the entry's name (see parseEvents)
	limit    int                 // entries it may hold
	overflow bool
}

type tracker struct {
	mu sync.Mutex
	f  *os.File // the fanotify group, nil while none is wanted
	// dfd is a duplicate of f's descriptor that drain reads without
	// blocking: reading f itself would wait for the reader, which holds
	// f's read lock while it waits for events. -1 while f is nil.
	dfd     int
	mount   *os.File // the workspace's root, for open_by_handle_at
	dir     string   // the workspace's path, which resolved paths start with
	records map[string]*record
	order   []string // ids, oldest first
	done    chan struct{}
	limit   int    // entries a record may hold: maxRecord (tests lower it)
	key     []byte // feedLocked's key, room for the longest (handle and name)
}

func (a *Agent) trackerFor() *tracker {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tr == nil {
		a.tr = &tracker{records: map[string]*record{}, limit: maxRecord, dfd: -1}
	}
	return a.tr
}

// track starts record id (a no-op when it exists), holding at most limit
// entries (the tracker's bound when 0 or more).
func (a *Agent) track(id string, limit int) error {
	if id == "" || len(id) > 64 {
		return &guest.Error{Code: guest.CodeBadRequest, Op: guest.OpTrack, Message: "tracker id must be 1 to 64 bytes"}
	}
	if _, err := a.workspace(); err != nil {
		return err
	}
	a.mu.Lock()
	dir := a.wsDir
	a.mu.Unlock()
	t := a.trackerFor()
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.records[id]; ok {
		return nil
	}
	if t.f == nil {
		if err := t.startLocked(dir); err != nil {
			return err
		}
	}
	if len(t.order) >= maxTrackers {
		delete(t.records, t.order[0])
		t.order = t.order[1:]
	}
	if limit <= 0 || limit > t.limit {
		limit = t.limit
	}
	t.records[id] = &record{since: time.Now(), keys: map[string]struct{}{}, limit: limit}
	t.order = append(t.order, id)
	return nil
}

func (t *tracker) startLocked(dir string) error {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK|unix.FAN_REPORT_DFID_NAME, unix.O_RDONLY|unix.O_LARGEFILE)
	if err != nil {
		return fmt.Errorf("fanotify_init: %w", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, trackMask, unix.AT_FDCWD, dir); err != nil {
		unix.Close(fd)
		return fmt.Errorf("fanotify_mark %s: %w", dir, err)
	}
	mount, err := os.Open(dir)
	if err != nil {
		unix.Close(fd)
		return err
	}
	dfd, err := unix.Dup(fd)
	if err != nil {
		unix.Close(fd)
		mount.Close()
		return fmt.Errorf("dup the fanotify descriptor: %w", err)
	}
	unix.CloseOnExec(dfd)
	t.dfd = dfd
	// Non-blocking, so the runtime's poller waits for events and a Close
	// ends the reader.
	t.f, t.mount, t.dir, t.done = os.NewFile(uintptr(fd), "fanotify"), mount, filepath.Clean(dir), make(chan struct{})
	go t.read(t.f, t.done)
	return nil
}

// readPause is how long the reader lets events gather between reads.
// Woken for every event, it took the CPU from the writer as often: an
// untar of 10,000 files in a recorded run took 9 times as long as without
// (one vCPU under TCG). The kernel's queue holds 16,384 events, so a
// writer would need over 300,000 changes a second to overflow it (which
// only falls back to a full comparison); and a record is drained of what
// is queued before it is read (drain), so the pause delays nothing a
// diff sees.
const readPause = 50 * time.Millisecond

// read feeds events to the records until f is closed.
func (t *tracker) read(f *os.File, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, io.EOF) {
				return
			}
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		t.feed(buf[:n])
		time.Sleep(readPause)
	}
}

// feed adds a buffer of events to every record.
func (t *tracker) feed(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.feedLocked(b)
}

func (t *tracker) feedLocked(b []byte) {
	// A file written in many calls has many events of one key: looked up
	// as bytes, only a key new to a record is allocated (the agent's
	// share of a tracked untar's cost is mostly this loop).
	if t.key == nil {
		t.key = make([]byte, 0, 5+128+256)
	}
	overflow := eachEvent(b, t.key, func(k []byte) {
		for _, r := range t.records {
			if r.overflow {
				continue
			}
			if _, ok := r.keys[string(k)]; ok {
				continue
			}
			r.keys[string(k)] = struct{}{}
			if len(r.keys) > r.limit {
				r.drop()
			}
		}
	})
	if overflow {
		for _, r := range t.records {
			r.drop()
		}
	}
}

// drain reads what the kernel has queued into the records now, so a
// record read next holds every change made before it was asked for.
// It holds t.mu throughout, so untrack cannot close dfd under it.
func (t *tracker) drain() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dfd < 0 {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(t.dfd, buf)
		if n <= 0 || err != nil {
			return // EAGAIN: nothing more is queued (the descriptor does not block)
		}
		t.feedLocked(buf[:n])
	}
}

func (r *record) drop() {
	r.overflow = true
	r.keys = nil
}

// untrack drops record id, and the fanotify group with the last one.
func (a *Agent) untrack(id string) {
	t := a.trackerFor()
	t.mu.Lock()
	delete(t.records, id)
	for i, o := range t.order {
		if o == id {
			t.order = append(t.order[:i], t.order[i+1:]...)
			break
		}
	}
	var f, mount *os.File
	var done chan struct{}
	if len(t.records) == 0 && t.f != nil {
		f, mount, done = t.f, t.mount, t.done
		t.f, t.mount = nil, nil
		unix.Close(t.dfd)
		t.dfd = -1
	}
	t.mu.Unlock()
	if f != nil {
		f.Close()
		<-done
		mount.Close()
	}
}

// changes sends record id: its state, then its paths in batches.
func (a *Agent) changes(s *stream, id string) error {
	t := a.trackerFor()
	t.drain()
	t.mu.Lock()
	r, ok := t.records[id]
	var st guest.TrackState
	var keys []string
	var mount *os.File
	dir := t.dir
	if ok {
		st = guest.TrackState{Known: true, Overflow: r.overflow, Since: r.since.UnixNano()}
		for k := range r.keys {
			keys = append(keys, k)
		}
		mount = t.mount
	}
	t.mu.Unlock()
	var paths []string
	if ok && !st.Overflow {
		paths = resolve(mount, dir, keys)
	}
	st.Paths = len(paths)
	if err := s.sendJSON(guest.FrameResult, st); err != nil {
		return nil
	}
	for len(paths) > 0 {
		n := min(len(paths), 2048)
		if s.sendJSON(guest.FrameData, paths[:n]) != nil {
			return nil
		}
		paths = paths[n:]
	}
	s.send(guest.FrameEnd, nil)
	return nil
}

// resolve turns keys into paths relative to dir: each directory handle
// is opened (once) and its path read back; a directory that no longer
// exists is skipped (its removal is recorded in its parent, under its
// name).
func resolve(mount *os.File, dir string, keys []string) []string {
	dirs := map[string]string{} // handle key → path relative to dir, or "\x00" when gone
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		hk, name := splitKey(k)
		if hk == "" {
			continue
		}
		rel, ok := dirs[hk]
		if !ok {
			rel = "\x00"
			if p, err := handlePath(mount, hk); err == nil {
				if p == dir {
					rel = ""
				} else if r, ok := strings.CutPrefix(p, dir+"/"); ok {
					rel = r
				}
			}
			dirs[hk] = rel
		}
		if rel == "\x00" {
			continue
		}
		p := rel
		if name != "" && name != "." {
			if p == "" {
				p = name
			} else {
				p = p + "/" + name
			}
		}
		if p == "" {
			p = "."
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// splitKey splits a record's key into its directory's handle key (the
// handle's length byte, type and bytes) and the entry's name.
func splitKey(k string) (hk, name string) {
	if len(k) < 5 || len(k) < 5+int(k[0]) {
		return "", ""
	}
	n := 5 + int(k[0])
	return k[:n], k[n:]
}

// handlePath opens a directory by its handle key and reads its path.
func handlePath(mount *os.File, hk string) (string, error) {
	if len(hk) < 5 {
		return "", errors.New("short handle")
	}
	typ := int32(binary.LittleEndian.Uint32([]byte(hk[1:5])))
	h := unix.NewFileHandle(typ, []byte(hk[5:]))
	fd, err := unix.OpenByHandleAt(int(mount.Fd()), h, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}

// parseEvents reads a buffer of fanotify events (FAN_REPORT_DFID_NAME):
// each event's key (its directory's handle: a length byte, the type and
// the bytes; then the entry's name, none for an event on a directory
// itself), and whether the kernel's queue overflowed.
func parseEvents(b []byte) (keys []string, overflow bool) {
	overflow = eachEvent(b, nil, func(k []byte) { keys = append(keys, string(k)) })
	return keys, overflow
}

// eachEvent calls fn with each event's key (see parseEvents), built in
// buf's storage and valid only during the call, and reports whether the
// kernel's queue overflowed. The kernel's bytes are checked as any
// peer's: a malformed event ends the parse.
func eachEvent(b, buf []byte, fn func(key []byte)) (overflow bool) {
	le := binary.LittleEndian
	for len(b) >= 24 {
		evLen := int(le.Uint32(b[0:]))
		metaLen := int(le.Uint16(b[6:]))
		mask := le.Uint64(b[8:])
		if evLen < 24 || evLen > len(b) || metaLen < 24 || metaLen > evLen {
			return overflow
		}
		if mask&unix.FAN_Q_OVERFLOW != 0 {
			overflow = true
		}
		info := b[metaLen:evLen]
		for len(info) >= 4 {
			typ, infoLen := info[0], int(le.Uint16(info[2:]))
			if infoLen < 4 || infoLen > len(info) {
				break
			}
			rec := info[:infoLen]
			info = info[infoLen:]
			if typ != unix.FAN_EVENT_INFO_TYPE_DFID_NAME && typ != unix.FAN_EVENT_INFO_TYPE_DFID && typ != unix.FAN_EVENT_INFO_TYPE_FID {
				continue
			}
			// header (4), fsid (8), handle_bytes (4), handle_type (4), handle, [name NUL]
			if len(rec) < 20 {
				continue
			}
			hb := int(le.Uint32(rec[12:]))
			if hb > 128 || 20+hb > len(rec) {
				continue
			}
			var name []byte
			if typ == unix.FAN_EVENT_INFO_TYPE_DFID_NAME {
				rest := rec[20+hb:]
				i := indexNUL(rest)
				if i < 0 {
					continue
				}
				name = rest[:i]
				if bytes.IndexByte(name, '/') >= 0 {
					continue
				}
			}
			buf = append(buf[:0], byte(hb))
			buf = append(buf, rec[16:20]...)
			buf = append(buf, rec[20:20+hb]...)
			buf = append(buf, name...)
			fn(buf)
			break // one key per event: the first record names it
		}
		b = b[evLen:]
	}
	return overflow
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
