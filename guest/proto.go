// Package guest is berth's host↔agent protocol: the resync handshake on the
// raw channel, the framing used on each multiplexed stream, the request and
// reply types, and the host-side Client. The agent itself (package
// guest/agent) runs inside the VM and shares these definitions.
//
// Layers, bottom up: a raw byte stream (virtio-serial port or hybrid vsock);
// a line-based resync handshake that discards bytes left over from an
// earlier connection; hashicorp/yamux; one yamux stream per call, carrying
// length-prefixed frames.
package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/berthvm/berth/guest/tree"
)

// Version is the protocol version. The handshake carries it, so a host and
// an agent built from different berth releases refuse each other clearly
// instead of misparsing frames.
const Version = 1

// VsockPort is the vsock port the agent listens on (Cloud Hypervisor).
const VsockPort = 1024

// PortName is the virtio-serial port name the agent looks for (QEMU).
const PortName = "berth.agent"

// MaxFrame bounds a frame's payload. Both sides refuse larger frames: the
// guest is untrusted and a corrupt length must not make the host allocate
// gigabytes.
const MaxFrame = 1 << 20

// DataChunk is the size of output and file data frames. Large enough that
// per-frame overhead vanishes, small enough to interleave streams fairly.
const DataChunk = 256 << 10

// FrameType identifies a frame on a stream.
type FrameType uint8

const (
	FrameRequest  FrameType = iota + 1 // JSON Request; first frame of every stream
	FrameResult                        // JSON reply; ends a unary call
	FrameError                         // JSON *Error; ends any call (on an open stream, answers one request)
	FrameStarted                       // JSON ExecInfo; an exec has started or been attached
	FrameStdout                        // 8-byte offset + bytes
	FrameStderr                        // 8-byte offset + bytes
	FrameExit                          // JSON ExecInfo with the exit; ends an exec stream
	FrameStdin                         // bytes for the command's stdin
	FrameStdinEOF                      // close the command's stdin
	FrameResize                        // JSON WinSize
	FrameAck                           // JSON Ack: output up to these offsets is stored by the host
	FrameData                          // file bytes
	FrameEnd                           // end of file bytes
	// On an open stream (OpOpen), after the open's FrameResult, each of
	// these is one request, answered by one frame in the order sent.
	FrameReadAt  // 8-byte offset + 4-byte length; FrameData (short only at end of file) or FrameError
	FrameWriteAt // 8-byte offset + bytes; FrameResult WriteAtResult or FrameError
	FrameCall    // JSON HandleCall; FrameResult (FileInfo for stat) or FrameError
)

// WriteFrame writes one frame. It is not safe for concurrent use on one
// writer; callers serialise.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFrame+8 {
		return fmt.Errorf("frame of %d bytes exceeds the %d byte limit", len(payload), MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One write keeps the frame in one yamux data frame when it fits.
	if len(payload) <= 4096 {
		buf := make([]byte, 0, 5+len(payload))
		buf = append(append(buf, hdr[:]...), payload...)
		_, err := w.Write(buf)
		return err
	}
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// FrameHeader is the size of a frame's header.
const FrameHeader = 5

// WriteFrameBuf writes a frame whose payload is buf[FrameHeader:], filling
// in the header in place: one write, no copy. Bulk senders use it, since
// every write is a multiplexer frame and, in an emulated guest, every copy
// counts.
func WriteFrameBuf(w io.Writer, t FrameType, buf []byte) error {
	n := len(buf) - FrameHeader
	if n < 0 || n > MaxFrame+8 {
		return fmt.Errorf("frame of %d bytes exceeds the %d byte limit", n, MaxFrame)
	}
	buf[0] = byte(t)
	binary.BigEndian.PutUint32(buf[1:], uint32(n))
	_, err := w.Write(buf)
	return err
}

// FrameReader reads frames, reusing its buffer: a payload is valid until
// the next call to Next.
type FrameReader struct {
	r   io.Reader
	hdr [5]byte
	buf []byte
}

// NewFrameReader returns a FrameReader on r.
func NewFrameReader(r io.Reader) *FrameReader { return &FrameReader{r: r} }

// Next returns the next frame. A stream that ends between frames yields
// io.EOF; one that ends inside a frame yields io.ErrUnexpectedEOF.
func (fr *FrameReader) Next() (FrameType, []byte, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[1:])
	if n > MaxFrame+8 {
		return 0, nil, fmt.Errorf("peer sent a frame of %d bytes, over the %d byte limit", n, MaxFrame)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return FrameType(fr.hdr[0]), p, nil
}

// Request is the first frame of every stream.
type Request struct {
	Op string `json:"op"`

	Exec   *ExecRequest `json:"exec,omitempty"`
	ID     string       `json:"id,omitempty"`     // exec id for attach, signal, forget
	Signal int          `json:"signal,omitempty"` // for signal
	// Offsets to attach from.
	Stdout int64 `json:"stdout,omitempty"`
	Stderr int64 `json:"stderr,omitempty"`

	Path string   `json:"path,omitempty"`
	To   string   `json:"to,omitempty"`   // rename target
	Mode uint32   `json:"mode,omitempty"` // write/mkdir permission bits
	All  bool     `json:"all,omitempty"`  // mkdir -p, rm -r
	Time int64    `json:"time,omitempty"` // thaw or mount after a restore: unix nanoseconds
	Data []byte   `json:"data,omitempty"` // small payloads (reseed)
	Wait Duration `json:"wait,omitempty"` // shutdown grace
	// Mount says what to mount after a template restore.
	Mount *MountSpec `json:"mount,omitempty"`

	Flags  int    `json:"flags,omitempty"`  // open: Open* flags
	Target string `json:"target,omitempty"` // symlink: the link's content, stored as given
	Attrs  *Attrs `json:"attrs,omitempty"`  // setstat
	// User owns what a write, open, mkdir, symlink or unpack creates:
	// NAME or UID, with an optional :GROUP or :GID, resolved in the guest
	// as ExecRequest.User is; "" is root. What it replaces keeps its owner.
	User string `json:"user,omitempty"`
	// Paths are what a scan describes; Sums asks for regular files'
	// content hashes. All (above) walks each directory named.
	Paths []string `json:"paths,omitempty"`
	Sums  bool     `json:"sums,omitempty"`
	// Limit bounds a change record (OpTrack): the distinct entries it may
	// hold before it overflows; 0 or past MaxTrackRecord is that.
	Limit int `json:"limit,omitempty"`
	// Port is the guest loopback port a dial connects to.
	Port int `json:"port,omitempty"`
	// TCP marks a DNS query that came over TCP: its reply may be longer
	// than a UDP one.
	TCP bool `json:"tcp,omitempty"`
}

// MountSpec is what a VM restored from a template (booted with no disks
// of its own) mounts once the session's disks are plugged in.
type MountSpec struct {
	Workspace string `json:"workspace"`        // the workspace's ext4 UUID
	System    string `json:"system,omitempty"` // the system disk's ext4 UUID (root filesystem images)
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machine_id,omitempty"`
	// NICMAC, in a fork's spec, is the MAC its NIC takes (with the
	// address NICAddrOf gives it) in place of the source's, which the
	// restored device state carries.
	NICMAC string `json:"nic_mac,omitempty"`
}

// MaxTrackRecord is the most distinct entries a change record holds
// (OpTrack) before it overflows, and the bound of one that names none.
const MaxTrackRecord = 100_000

// Ops.
const (
	OpHello    = "hello"
	OpExec     = "exec"
	OpAttach   = "attach"
	OpSignal   = "signal"
	OpExecs    = "execs"
	OpForget   = "forget"
	OpStat     = "stat"
	OpList     = "list"
	OpRead     = "read"
	OpWrite    = "write"
	OpMkdir    = "mkdir"
	OpRemove   = "remove"
	OpRename   = "rename"
	OpFlush    = "flush"
	OpStats    = "stats"
	OpShutdown = "shutdown"
	OpMount    = "mount"
	OpFreeze   = "freeze"
	OpThaw     = "thaw"
	OpPack     = "pack"   // stream a tree out of /workspace as tar
	OpUnpack   = "unpack" // write a tar stream into /workspace, durably

	// OpOpen opens a file and keeps the stream for the handle's life:
	// FrameReadAt, FrameWriteAt and FrameCall requests follow, each
	// answered in order, until a HandleClose call (or the stream's end,
	// which releases the handle as a close would not: a staged file is
	// dropped).
	OpOpen       = "open"
	OpSetstat    = "setstat"    // Attrs on Path, following symlinks
	OpStatFollow = "statfollow" // Stat following a final symlink
	OpSymlink    = "symlink"    // Path becomes a symlink to Target
	OpLink       = "link"       // To becomes a hard link to Path
	OpStatfs     = "statfs"     // the figures of the filesystem holding Path
	OpRmdir      = "rmdir"      // remove an empty directory, never a file
	OpFork       = "fork"       // a VM restored from another session's snapshot takes its own identity

	// A diff's view of /workspace: OpScan describes paths (their
	// identity, times and content hashes); OpTrack starts recording which
	// paths change under tracker ID, OpChanges reads that record and
	// OpUntrack drops it.
	OpScan    = "scan"
	OpTrack   = "track"
	OpChanges = "changes"
	OpUntrack = "untrack"
)

// ScanEntry describes one path under /workspace for a diff. Missing marks
// a path asked for that does not exist.
type ScanEntry struct {
	Path    string `json:"p"`
	Missing bool   `json:"x,omitempty"`
	Mode    uint32 `json:"m,omitempty"` // io/fs.FileMode bits
	Size    int64  `json:"s,omitempty"`
	Link    string `json:"l,omitempty"`
	// Ino and Gen are the file's identity (inode number and generation),
	// Ctime its last change in unix nanoseconds: a file with the same
	// three in a checkpoint of this filesystem has not changed since.
	Ino   uint64 `json:"i,omitempty"`
	Gen   uint32 `json:"g,omitempty"`
	Ctime int64  `json:"c,omitempty"`
	Sum   string `json:"h,omitempty"` // sha256 of a regular file, with Request.Sums
}

// TrackState heads a reply to OpChanges; the changed paths follow in
// data frames. Known is false when the agent holds no record of that id
// (it was never started, or the VM booted since); Overflow when the
// record outgrew its bound and was dropped: either way only a full
// comparison finds the changes.
type TrackState struct {
	Known    bool  `json:"known"`
	Overflow bool  `json:"overflow,omitempty"`
	Paths    int   `json:"paths"`
	Since    int64 `json:"since,omitempty"` // unix nanoseconds
}

// Open flags (Request.Flags), the same values whatever the host's or the
// guest's O_ constants.
const (
	OpenRead      = 0x1  // O_RDONLY when alone
	OpenWrite     = 0x2  // O_WRONLY, or O_RDWR with OpenRead
	OpenAppend    = 0x4  // writes go to the end, whatever their offset
	OpenCreate    = 0x8  // create if missing
	OpenTruncate  = 0x10 // truncate to zero
	OpenExclusive = 0x20 // with OpenCreate: fail if it exists (atomic)
)

// OpenResult is the reply to OpOpen. Staged says the handle writes a
// temporary file that its close renames into place.
type OpenResult struct {
	Staged bool `json:"staged,omitempty"`
}

// Attrs are what OpSetstat and HandleSetstat change; nil fields stay.
type Attrs struct {
	Size  *int64     `json:"size,omitempty"`
	Mode  *uint32    `json:"mode,omitempty"` // io/fs.FileMode permission, setuid, setgid and sticky bits
	Atime *time.Time `json:"atime,omitempty"`
	Mtime *time.Time `json:"mtime,omitempty"`
	UID   *int       `json:"uid,omitempty"`
	GID   *int       `json:"gid,omitempty"`
	// Owner gives the file to a user named as ExecRequest.User names one,
	// resolved in the guest; OpSetstat only, and not with UID or GID.
	Owner string `json:"owner,omitempty"`
}

// Calls on an open handle (HandleCall.Op).
const (
	HandleStat    = "stat"
	HandleSetstat = "setstat"
	HandleSync    = "sync"
	HandleClose   = "close" // the reply is the stream's last frame
)

// HandleCall is a FrameCall request.
type HandleCall struct {
	Op    string `json:"op"`
	Attrs *Attrs `json:"attrs,omitempty"`
}

// WriteAtResult answers a FrameWriteAt.
type WriteAtResult struct {
	N int `json:"n"`
}

// FSStat is a filesystem's figures, as statvfs(3) gives them.
type FSStat struct {
	BlockSize    uint64 `json:"bsize"`
	FragmentSize uint64 `json:"frsize"`
	Blocks       uint64 `json:"blocks"`
	BlocksFree   uint64 `json:"bfree"`
	BlocksAvail  uint64 `json:"bavail"`
	Files        uint64 `json:"files"`
	FilesFree    uint64 `json:"ffree"`
	FilesAvail   uint64 `json:"favail"`
	FSID         uint64 `json:"fsid"`
	Flags        uint64 `json:"flag"` // ST_RDONLY (1), ST_NOSUID (2)…
	NameMax      uint64 `json:"namemax"`
}

// Duration is a time.Duration that travels as nanoseconds.
type Duration = time.Duration

// Hello is the agent's self-description.
type Hello struct {
	Version   int       `json:"version"`
	Agent     string    `json:"agent"` // agent build id
	Workspace Workspace `json:"workspace"`
	// System is the system disk under the root overlay; Mounted is false
	// for images whose root is the initramfs (Error says so).
	System   Workspace `json:"system"`
	Hostname string    `json:"hostname,omitempty"`
	Booted   time.Time `json:"booted"`
	Channel  string    `json:"channel"` // "virtio-serial" or "vsock"
}

// Workspace reports the state of /workspace (or of the system disk) in
// the guest.
type Workspace struct {
	Mounted bool   `json:"mounted"`
	Device  string `json:"device,omitempty"`
	UUID    string `json:"uuid,omitempty"`
	Error   string `json:"error,omitempty"` // why it is not mounted
}

// ExecRequest describes a command for the agent to run.
type ExecRequest struct {
	// ID is chosen by the host so that a retried start after a lost reply
	// finds the same execution instead of running the command twice.
	ID   string            `json:"id"`
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	TTY  bool              `json:"tty,omitempty"`
	Rows int               `json:"rows,omitempty"`
	Cols int               `json:"cols,omitempty"`
	// Stdin reports whether the host will send stdin; without it the
	// command's stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// User is who the command runs as: NAME or UID, with an optional
	// :GROUP or :GID (guest/users), resolved in the guest against its own
	// /etc/passwd and /etc/group; "" is root.
	User string `json:"user,omitempty"`
}

// ExecInfo describes an execution in the agent.
type ExecInfo struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Running bool      `json:"running"`
	Started time.Time `json:"started"`
	// Set once the process has exited.
	ExitCode int       `json:"exit_code"`
	Signal   string    `json:"signal,omitempty"`
	Ended    time.Time `json:"ended,omitzero"`
	// Bytes produced so far on each stream, and the oldest offset the agent
	// still holds for each.
	StdoutEnd   int64 `json:"stdout_end"`
	StderrEnd   int64 `json:"stderr_end"`
	StdoutStart int64 `json:"stdout_start"`
	StderrStart int64 `json:"stderr_start"`
}

// WinSize is a terminal size.
type WinSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Ack tells the agent the host has stored output up to these offsets, so
// it may drop it.
type Ack struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

// FileInfo describes a file under /workspace.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // io/fs.FileMode bits
	ModTime time.Time `json:"mtime"`
	Link    string    `json:"link,omitempty"`
}

// WriteResult reports a durable write.
type WriteResult struct {
	Size int64 `json:"size"`
}

// TreeResult reports a tree copy.
type TreeResult = tree.Result

// FlushResult reports a flush of /workspace.
type FlushResult struct {
	DirtyBefore int64    `json:"dirty_before"`
	DirtyAfter  int64    `json:"dirty_after"`
	Took        Duration `json:"took"`
}

// Stats are the guest's live figures.
type Stats struct {
	MemTotal      int64      `json:"mem_total"`
	MemAvailable  int64      `json:"mem_available"`
	Dirty         int64      `json:"dirty"`
	Writeback     int64      `json:"writeback"`
	Uptime        Duration   `json:"uptime"`
	Load          [3]float64 `json:"load"`
	WorkspaceSize int64      `json:"workspace_size"`
	WorkspaceUsed int64      `json:"workspace_used"`
	SystemSize    int64      `json:"system_size,omitempty"`
	SystemUsed    int64      `json:"system_used,omitempty"`
	Running       int        `json:"running"` // executions still running

	// The guest's own CPU view, from the first line of /proc/stat: busy
	// and total time of all its CPUs together, in clock ticks (USER_HZ),
	// since it booted. An agent older than these fields leaves them 0.
	CPUBusyTicks  uint64 `json:"cpu_busy_ticks,omitempty"`
	CPUTotalTicks uint64 `json:"cpu_total_ticks,omitempty"`
	CPUs          int    `json:"cpus,omitempty"`
	// Bytes read from and written to the workspace and system disks since
	// boot, from /proc/diskstats.
	WorkspaceIO DiskIO `json:"workspace_io,omitzero"`
	SystemIO    DiskIO `json:"system_io,omitzero"`
}

// DiskIO counts one block device's traffic since boot.
type DiskIO struct {
	ReadBytes  int64 `json:"read_bytes"`
	WriteBytes int64 `json:"write_bytes"`
}

// Error is an error reported by the agent. Code is an errno name (ENOENT,
// ENOSPC…) or one of the berth codes below, so the host can tell a missing
// file from a full disk without parsing text.
type Error struct {
	Code    string `json:"code"`
	Op      string `json:"op,omitempty"`
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// berth-specific error codes.
const (
	CodeNoWorkspace = "ENOWORKSPACE" // /workspace is not the session's volume
	CodeEscape      = "EESCAPE"      // path leads outside /workspace
	CodeUnknownExec = "ENOEXEC_ID"   // the agent does not know this execution
	CodeBadRequest  = "EBADREQ"
	CodeGap         = "EGAP" // requested output was already dropped
)

func (e *Error) Error() string {
	// Every part is guest text, bounded before it reaches a person.
	msg, op, path := clipText(e.Message), clipText(e.Op), clipText(e.Path)
	switch {
	case op != "" && path != "":
		return fmt.Sprintf("%s %s: %s", op, path, msg)
	case op != "":
		return op + ": " + msg
	}
	return msg
}

// maxErrorPart bounds each part of an agent's error text.
const maxErrorPart = 512

// clipText bounds s to maxErrorPart bytes, cut at a rune's start so the
// result stays valid UTF-8.
func clipText(s string) string {
	if len(s) <= maxErrorPart {
		return s
	}
	cut := maxErrorPart
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Unwrap maps the code to a syscall errno or a berth error, so errors.Is
// works with fs.ErrNotExist, syscall.ENOSPC, ErrEscape and friends.
func (e *Error) Unwrap() error {
	switch e.Code {
	case CodeNoWorkspace:
		return ErrNoWorkspace
	case CodeEscape:
		return ErrEscape
	case CodeUnknownExec:
		return ErrUnknownExec
	case CodeGap:
		return ErrGap
	}
	if errno, ok := errnoByName[e.Code]; ok {
		return errno
	}
	return nil
}

// Errors the host can test for with errors.Is.
var (
	ErrNoWorkspace  = errors.New("workspace not mounted")
	ErrEscape       = tree.ErrEscape
	ErrUnknownExec  = errors.New("agent does not know this execution")
	ErrGap          = errors.New("output was dropped before it could be read")
	ErrDisconnected = errors.New("agent channel disconnected")
)

// ForkResult reports what a forked VM's agent changed. A filesystem whose
// UUID could not be changed online (an ext4 without metadata_csum_seed)
// keeps the source's; Errors says why.
type ForkResult struct {
	WorkspaceUUID bool     `json:"workspace_uuid"`
	SystemUUID    bool     `json:"system_uuid"`
	BootID        string   `json:"boot_id,omitempty"`
	Inherited     int      `json:"inherited"` // executions forgotten, still running
	Errors        []string `json:"errors,omitempty"`
}
