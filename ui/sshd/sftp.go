package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	"github.com/pkg/sftp"

	"github.com/berthvm/berth/session"
)

// workspace is the only directory sftp clients see.
const workspace = "/workspace"

// handleSFTP serves the sftp subsystem onto the /workspace of the session
// named by the SSH user name (sftp NAME@HOST).
func (s *Server) handleSFTP(sess ssh.Session) {
	if _, winCh, isPty := sess.Pty(); isPty {
		feedSizes(winCh) // nobody resizes sftp, but the channel must drain
	}
	if !s.begin() {
		fmt.Fprintln(sess.Stderr(), "berth: the server is shutting down; try again shortly")
		sess.Exit(1)
		return
	}
	defer s.handlers.Done()
	ak, _, err := s.identify(sess)
	if err != nil {
		fmt.Fprintf(sess.Stderr(), "berth: %s\n", oneLine(err))
		sess.Exit(1)
		return
	}
	ctx, cancel := context.WithCancel(sess.Context())
	defer cancel()
	svc := s.serviceFor(ak)
	name := sess.User()
	log := s.log.With("remote", sess.RemoteAddr().String(), "key", ak.Fingerprint, "name", ak.Name(), "role", ak.Role.String(), "session", name)
	if _, err := svc.Get(ctx, name); err != nil {
		fmt.Fprintf(sess.Stderr(), "berth: sftp: %s (connect as NAME@HOST, where NAME is a session: 'ssh HOST ls' lists them)\n", oneLine(err))
		sess.Exit(1)
		return
	}
	log.Info("ssh: sftp")
	fsys := &sftpFS{ctx: ctx, svc: svc, name: name, may: func(o op) error {
		role, err := s.currentRole(ak.Key)
		if err != nil {
			return err
		}
		return role.allows(o)
	}}
	rs := sftp.NewRequestServer(sess, sftp.Handlers{FileGet: fsys, FilePut: fsys, FileCmd: fsys, FileList: fsys},
		sftp.WithStartDirectory(workspace))
	stop := context.AfterFunc(ctx, func() { rs.Close() }) // the server shuts down or the client leaves
	err = rs.Serve()
	stop()
	rs.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		log.Info("ssh: sftp ended", "err", err)
	}
	sess.Exit(0)
}

// sftpFS maps sftp requests onto one session's Files.
type sftpFS struct {
	ctx  context.Context
	svc  session.Files // restricted to the key's role
	name string
	// may checks an op early, where the Service would only refuse it
	// after the data arrived.
	may func(op) error
}

var (
	_ sftp.FileReader           = (*sftpFS)(nil)
	_ sftp.FileWriter           = (*sftpFS)(nil)
	_ sftp.PosixRenameFileCmder = (*sftpFS)(nil)
	_ sftp.RealPathFileLister   = (*sftpFS)(nil)
)

// wsPath confines a client path (already cleaned and made absolute by
// the request server, with /workspace as the start directory) to
// /workspace.
func wsPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q has a NUL byte: %w", p, sftp.ErrSSHFxBadMessage)
	}
	p = path.Clean("/" + p)
	if p != workspace && !strings.HasPrefix(p, workspace+"/") {
		return "", fmt.Errorf("path %s is outside %s; only the session's workspace is served: %w", p, workspace, sftp.ErrSSHFxPermissionDenied)
	}
	return p, nil
}

// sftpErr gives a Service error the sftp status its class calls for; the
// message goes along.
func sftpErr(err error) error {
	if err == nil {
		return nil
	}
	var code error
	switch {
	case errors.Is(err, session.ErrNotFound):
		code = sftp.ErrSSHFxNoSuchFile
	case errors.Is(err, session.ErrPermission):
		code = sftp.ErrSSHFxPermissionDenied
	case errors.Is(err, session.ErrInvalid) && strings.Contains(err.Error(), "outside /workspace"):
		code = sftp.ErrSSHFxPermissionDenied
	case errors.Is(err, session.ErrUnavailable):
		code = sftp.ErrSSHFxNoConnection
	default:
		code = sftp.ErrSSHFxFailure
	}
	return fmt.Errorf("%s: %w", oneLine(err), code)
}

// RealPath resolves a path against /workspace; paths outside it resolve
// (so "cd .." says where it went) but cannot be used.
func (f *sftpFS) RealPath(p string) (string, error) {
	if !path.IsAbs(p) {
		p = path.Join(workspace, p)
	}
	return path.Clean(p), nil
}

// Filelist serves List and Stat (Lstat and Readlink fall back to Stat).
func (f *sftpFS) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	p, err := wsPath(r.Filepath)
	if err != nil {
		return nil, err
	}
	switch r.Method {
	case "List":
		ents, err := f.svc.ListDir(f.ctx, f.name, p)
		if err != nil {
			return nil, sftpErr(err)
		}
		out := make(listerAt, len(ents))
		for i, e := range ents {
			out[i] = fileInfo{e}
		}
		return out, nil
	case "Stat":
		fi, err := f.svc.Stat(f.ctx, f.name, p)
		if err != nil {
			return nil, sftpErr(err)
		}
		return listerAt{fileInfo{fi}}, nil
	}
	return nil, fmt.Errorf("%s is not supported: %w", r.Method, sftp.ErrSSHFxOpUnsupported)
}

// Filecmd serves the changes.
func (f *sftpFS) Filecmd(r *sftp.Request) error {
	switch r.Method {
	case "Setstat":
		return fmt.Errorf("changing modes, owners or times is not supported in a berth workspace: %w", sftp.ErrSSHFxOpUnsupported)
	case "Link", "Symlink":
		return fmt.Errorf("links are not supported in a berth workspace: %w", sftp.ErrSSHFxOpUnsupported)
	}
	p, err := wsPath(r.Filepath)
	if err != nil {
		return err
	}
	switch r.Method {
	case "Mkdir":
		if _, err := f.svc.Stat(f.ctx, f.name, p); err == nil {
			return fmt.Errorf("mkdir %s: it already exists: %w", p, sftp.ErrSSHFxFailure)
		}
		return sftpErr(f.svc.Mkdir(f.ctx, f.name, p))
	case "Rmdir":
		ents, err := f.svc.ListDir(f.ctx, f.name, p)
		if err != nil {
			return sftpErr(err)
		}
		if len(ents) > 0 {
			return fmt.Errorf("rmdir %s: the directory is not empty: %w", p, sftp.ErrSSHFxFailure)
		}
		return sftpErr(f.svc.Remove(f.ctx, f.name, p))
	case "Remove":
		fi, err := f.svc.Stat(f.ctx, f.name, p)
		if err != nil {
			return sftpErr(err)
		}
		if fi.IsDir() {
			return fmt.Errorf("remove %s: it is a directory (use rmdir): %w", p, sftp.ErrSSHFxFailure)
		}
		return sftpErr(f.svc.Remove(f.ctx, f.name, p))
	case "Rename":
		to, err := wsPath(r.Target)
		if err != nil {
			return err
		}
		if _, err := f.svc.Stat(f.ctx, f.name, to); err == nil {
			return fmt.Errorf("rename to %s: it already exists: %w", to, sftp.ErrSSHFxFailure)
		}
		return sftpErr(f.svc.Rename(f.ctx, f.name, p, to))
	}
	return fmt.Errorf("%s is not supported in a berth workspace: %w", r.Method, sftp.ErrSSHFxOpUnsupported)
}

// PosixRename renames, replacing the target.
func (f *sftpFS) PosixRename(r *sftp.Request) error {
	from, err := wsPath(r.Filepath)
	if err != nil {
		return err
	}
	to, err := wsPath(r.Target)
	if err != nil {
		return err
	}
	return sftpErr(f.svc.Rename(f.ctx, f.name, from, to))
}

// Fileread opens a file for reading.
func (f *sftpFS) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	p, err := wsPath(r.Filepath)
	if err != nil {
		return nil, err
	}
	fi, err := f.svc.Stat(f.ctx, f.name, p)
	if err != nil {
		return nil, sftpErr(err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("read %s: it is a directory: %w", p, sftp.ErrSSHFxFailure)
	}
	rd := &download{open: func() (io.ReadCloser, error) { return f.svc.ReadFile(f.ctx, f.name, p) }}
	if err := rd.reopen(); err != nil {
		return nil, sftpErr(err)
	}
	return rd, nil
}

// Filewrite opens an upload: its data is piped into WriteFile, which
// replaces the file durably once the client closes the handle; if the
// client goes away first, WriteFile fails and the old content stays.
// Writes must arrive in order from offset 0 (as every sftp put sends
// them); appends and in-place edits are refused.
func (f *sftpFS) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	p, err := wsPath(r.Filepath)
	if err != nil {
		return nil, err
	}
	flags := r.Pflags()
	if flags.Append {
		return nil, fmt.Errorf("write %s: appending is not supported; upload the whole file: %w", p, sftp.ErrSSHFxOpUnsupported)
	}
	// Refuse early what WriteFile would refuse only after the upload.
	if err := f.may(opWriteFile); err != nil {
		return nil, sftpErr(err)
	}
	if fi, err := f.svc.Stat(f.ctx, f.name, p); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("write %s: it is a directory: %w", p, sftp.ErrSSHFxFailure)
	}
	if fi, err := f.svc.Stat(f.ctx, f.name, path.Dir(p)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("write %s: the directory %s does not exist: %w", p, path.Dir(p), sftp.ErrSSHFxNoSuchFile)
	}
	pr, pw := io.Pipe()
	u := &upload{pw: pw, pending: map[int64][]byte{}, done: make(chan struct{})}
	go func() { // ends when WriteFile returns: at EOF, or when the pipe fails
		defer close(u.done)
		u.n, u.err = f.svc.WriteFile(f.ctx, f.name, p, pr)
		// Unblock a writer still feeding a WriteFile that gave up.
		if u.err != nil {
			pr.CloseWithError(u.err)
		} else {
			pr.Close()
		}
	}()
	return u, nil
}

// maxPending bounds the out-of-order upload data held while an earlier
// write is still on its way (the request server runs writes on several
// workers).
const maxPending = 16 << 20

// upload feeds an sftp upload into a pipe in offset order.
type upload struct {
	pw   *io.PipeWriter
	done chan struct{}
	n    int64
	err  error

	mu           sync.Mutex
	next         int64
	pending      map[int64][]byte
	pendingBytes int
	failed       error
}

func (u *upload) WriteAt(b []byte, off int64) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failed != nil {
		return 0, u.failed
	}
	switch {
	case off < u.next:
		return 0, u.fail(fmt.Errorf("write at offset %d after %d bytes: uploads must be sequential: %w", off, u.next, sftp.ErrSSHFxOpUnsupported))
	case off > u.next:
		if _, dup := u.pending[off]; dup || u.pendingBytes+len(b) > maxPending {
			return 0, u.fail(fmt.Errorf("write at offset %d leaves a gap at %d: uploads must be sequential: %w", off, u.next, sftp.ErrSSHFxOpUnsupported))
		}
		u.pending[off] = append([]byte(nil), b...)
		u.pendingBytes += len(b)
		return len(b), nil
	}
	if err := u.writeLocked(b); err != nil {
		return 0, err
	}
	for {
		nb, ok := u.pending[u.next]
		if !ok {
			break
		}
		delete(u.pending, u.next)
		u.pendingBytes -= len(nb)
		if err := u.writeLocked(nb); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (u *upload) writeLocked(b []byte) error {
	if _, err := u.pw.Write(b); err != nil {
		return u.fail(fmt.Errorf("upload: %w", err))
	}
	u.next += int64(len(b))
	return nil
}

// fail ends the upload: WriteFile sees err and keeps the old content.
func (u *upload) fail(err error) error {
	if u.failed == nil {
		u.failed = err
		u.pw.CloseWithError(err)
	}
	return err
}

// TransferError is called when the client disconnects with the file
// open: the upload must not land.
func (u *upload) TransferError(err error) {
	u.pw.CloseWithError(fmt.Errorf("the client disconnected during the upload: %w", err))
}

// Close ends the upload and returns once the file is durable, or why it
// is not (the client sees that as the close's status).
func (u *upload) Close() error {
	u.mu.Lock()
	if len(u.pending) > 0 && u.failed == nil {
		u.fail(fmt.Errorf("upload closed with a gap at offset %d: %w", u.next, sftp.ErrSSHFxFailure))
	}
	u.pw.Close() // EOF, unless it already failed
	u.mu.Unlock()
	<-u.done
	if u.err != nil {
		return sftpErr(u.err)
	}
	return nil
}

// downloadWindow is how much already-read data a download keeps for
// requests that arrive out of order before it reopens the file.
const downloadWindow = 8 << 20

// download serves ReadAt from a sequential stream, keeping a window of
// what it read: the request server issues reads on several workers, so
// offsets arrive slightly out of order.
type download struct {
	open func() (io.ReadCloser, error)

	mu   sync.Mutex
	rc   io.ReadCloser
	base int64  // stream offset of buf[0]
	buf  []byte // data from base to the stream's position
	eof  bool
}

func (d *download) reopen() error {
	if d.rc != nil {
		d.rc.Close()
	}
	rc, err := d.open()
	if err != nil {
		return err
	}
	d.rc, d.base, d.buf, d.eof = rc, 0, d.buf[:0], false
	return nil
}

func (d *download) ReadAt(b []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off < d.base {
		if err := d.reopen(); err != nil {
			return 0, sftpErr(err)
		}
	}
	want := off + int64(len(b))
	for d.base+int64(len(d.buf)) < want && !d.eof {
		if behind := off - d.base; behind > downloadWindow {
			// Keep half a window before off for requests still coming.
			drop := min(int64(len(d.buf)), behind-downloadWindow/2)
			d.buf = append(d.buf[:0], d.buf[drop:]...)
			d.base += drop
		}
		if cap(d.buf)-len(d.buf) < 64<<10 {
			d.buf = append(d.buf, make([]byte, 64<<10)...)[:len(d.buf)]
		}
		n, err := d.rc.Read(d.buf[len(d.buf):cap(d.buf)])
		d.buf = d.buf[:len(d.buf)+n]
		if errors.Is(err, io.EOF) {
			d.eof = true
		} else if err != nil {
			return 0, sftpErr(err)
		}
	}
	end := d.base + int64(len(d.buf))
	if off >= end {
		return 0, io.EOF
	}
	n := copy(b, d.buf[off-d.base:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (d *download) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rc != nil {
		return d.rc.Close()
	}
	return nil
}

// listerAt serves directory listings and stats.
type listerAt []os.FileInfo

func (l listerAt) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if n < len(out) {
		return n, io.EOF
	}
	return n, nil
}

// fileInfo is a session.FileInfo as an os.FileInfo.
type fileInfo struct{ fi session.FileInfo }

func (f fileInfo) Name() string       { return f.fi.Name }
func (f fileInfo) Size() int64        { return f.fi.Size }
func (f fileInfo) Mode() fs.FileMode  { return f.fi.Mode }
func (f fileInfo) ModTime() time.Time { return f.fi.ModTime }
func (f fileInfo) IsDir() bool        { return f.fi.IsDir() }
func (f fileInfo) Sys() any           { return nil }
