package sshd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gliderlabs/ssh"

	"github.com/berthvm/berth/session"
)

// The classic scp protocol (scp -O): the client runs `scp -t TARGET` to
// upload or `scp -f SOURCE` to download on the remote side and talks to
// it over the channel. berth answers it itself, onto the session's file
// API, so it works in every image (mini has no scp) and uploads are
// durable like put: each file is complete and synced under its name
// before scp hears it arrived.

// isSCP reports whether argv is the remote side of a classic scp.
func isSCP(argv []string) bool {
	if len(argv) < 2 || argv[0] != "scp" {
		return false
	}
	for _, a := range argv[1:] {
		if a == "-t" || a == "-f" || (strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && strings.ContainsAny(a, "tf")) {
			return true
		}
	}
	return false
}

type scpArgs struct {
	sink, source, recursive, preserve, targetDir bool
	path                                         string
}

func parseSCP(argv []string) (scpArgs, error) {
	var a scpArgs
	rest := argv[1:]
	for len(rest) > 0 {
		arg := rest[0]
		if arg == "--" {
			rest = rest[1:]
			break
		}
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			break
		}
		for _, c := range arg[1:] {
			switch c {
			case 't':
				a.sink = true
			case 'f':
				a.source = true
			case 'r':
				a.recursive = true
			case 'p':
				a.preserve = true
			case 'd':
				a.targetDir = true
			case 'v', 'q', 'E':
			default:
				return a, fmt.Errorf("unsupported scp option -%c", c)
			}
		}
		rest = rest[1:]
	}
	if a.sink == a.source {
		return a, errors.New("scp needs exactly one of -t and -f")
	}
	if len(rest) != 1 {
		return a, errors.New("scp needs one path")
	}
	a.path = rest[0]
	return a, nil
}

// scpLine bounds one protocol line from the client.
const scpLine = 4096

// runSCP serves one classic scp transfer in session sn.
func (s *Server) runSCP(sess ssh.Session, svc session.Service, sn session.Session, argv []string) int {
	a, err := parseSCP(argv)
	if err != nil {
		fmt.Fprintf(sess.Stderr(), "scp: %v\n", err)
		return 1
	}
	t := &scpTransfer{ctx: sess.Context(), svc: svc, handles: svc, name: sn.Name, args: a,
		r: bufio.NewReaderSize(sess, 64<<10), w: sess, stderr: sess.Stderr()}
	if a.sink {
		err = t.sink()
	} else {
		err = t.source()
	}
	if err != nil {
		fmt.Fprintf(sess.Stderr(), "scp: %v\n", oneLine(err))
		return 1
	}
	if t.failed {
		return 1
	}
	return 0
}

type scpTransfer struct {
	ctx     context.Context
	svc     session.Service
	handles session.Handles // nil when the service offers none (no -p)
	name    string
	args    scpArgs
	r       *bufio.Reader
	w       io.Writer
	stderr  io.Writer
	failed  bool // a file failed; the transfer went on
}

func (t *scpTransfer) ack() error {
	_, err := t.w.Write([]byte{0})
	return err
}

// warn tells the client one item failed; the transfer goes on.
func (t *scpTransfer) warn(err error) error {
	t.failed = true
	_, werr := fmt.Fprintf(t.w, "\x01scp: %s\n", oneLine(err))
	return werr
}

func (t *scpTransfer) readLine() (string, error) {
	var b strings.Builder
	for b.Len() < scpLine {
		c, err := t.r.ReadByte()
		if err != nil {
			return b.String(), err
		}
		if c == '\n' {
			return b.String(), nil
		}
		b.WriteByte(c)
	}
	return "", fmt.Errorf("protocol line longer than %d bytes", scpLine)
}

// readAck reads the peer's answer: 0, or 1/2 and a message.
func (t *scpTransfer) readAck() error {
	c, err := t.r.ReadByte()
	if err != nil {
		return err
	}
	if c == 0 {
		return nil
	}
	msg, _ := t.readLine()
	if c == 1 {
		fmt.Fprintf(t.stderr, "scp: %s\n", msg)
		t.failed = true
		return nil
	}
	return fmt.Errorf("the client gave up: %s", msg)
}

// sink receives files into the session: scp -t.
func (t *scpTransfer) sink() error {
	target := t.args.path
	targetIsDir := false
	if fi, err := t.svc.Stat(t.ctx, t.name, target); err == nil {
		if fi.Mode&fs.ModeSymlink != 0 && t.handles != nil {
			if f, err := t.handles.StatFollow(t.ctx, t.name, target); err == nil {
				fi = f
			}
		}
		targetIsDir = fi.IsDir()
	}
	if t.args.targetDir && !targetIsDir {
		return fmt.Errorf("%s: not a directory", target)
	}
	if err := t.ack(); err != nil {
		return err
	}
	type dir struct {
		path         string
		mtime, atime time.Time
		hasTimes     bool
	}
	var stack []dir
	var mtime, atime time.Time
	hasTimes := false
	first := true
	dest := func(name string) string {
		if len(stack) > 0 {
			return path.Join(stack[len(stack)-1].path, name)
		}
		if targetIsDir || !first {
			return path.Join(target, name)
		}
		return target
	}
	for {
		line, err := t.readLine()
		if errors.Is(err, io.EOF) && line == "" {
			return nil
		}
		if err != nil {
			return err
		}
		if line == "" {
			continue
		}
		switch line[0] {
		case 0x01, 0x02:
			fmt.Fprintf(t.stderr, "scp: %s\n", line[1:])
			if line[0] == 0x02 {
				return nil
			}
		case 'T':
			mt, at, err := parseTimes(line[1:])
			if err != nil {
				return err
			}
			mtime, atime, hasTimes = mt, at, true
			if err := t.ack(); err != nil {
				return err
			}
		case 'E':
			if len(stack) == 0 {
				return errors.New("E without a directory")
			}
			d := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if d.hasTimes {
				t.setTimes(d.path, d.mtime, d.atime)
			}
			if err := t.ack(); err != nil {
				return err
			}
		case 'C', 'D':
			mode, size, name, err := parseItem(line)
			if err != nil {
				return err
			}
			to := dest(name)
			first = false
			if line[0] == 'D' {
				if !t.args.recursive {
					return errors.New("received a directory without -r")
				}
				if err := t.svc.Mkdir(t.ctx, t.name, to); err != nil && !errors.Is(err, session.ErrExists) {
					if werr := t.warn(fmt.Errorf("%s: %w", to, err)); werr != nil {
						return werr
					}
					// Its contents would land beside it: stop here.
					return fmt.Errorf("%s: %w", to, err)
				}
				t.setMode(to, mode)
				stack = append(stack, dir{path: to, mtime: mtime, atime: atime, hasTimes: hasTimes})
				hasTimes = false
				if err := t.ack(); err != nil {
					return err
				}
				continue
			}
			if err := t.ack(); err != nil {
				return err
			}
			body := io.LimitReader(t.r, size)
			_, werr := t.svc.WriteFile(t.ctx, t.name, to, body)
			io.Copy(io.Discard, body) // keep the stream in step after a failure
			if err := t.readAck(); err != nil {
				return err
			}
			if werr != nil {
				if err := t.warn(fmt.Errorf("%s: %w", to, werr)); err != nil {
					return err
				}
				hasTimes = false
				continue
			}
			t.setMode(to, mode)
			if hasTimes {
				t.setTimes(to, mtime, atime)
				hasTimes = false
			}
			if err := t.ack(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected protocol line %q", line)
		}
	}
}

func (t *scpTransfer) setMode(p string, mode fs.FileMode) {
	if t.handles == nil {
		return
	}
	t.handles.Setstat(t.ctx, t.name, p, session.Attrs{Mode: &mode})
}

func (t *scpTransfer) setTimes(p string, mtime, atime time.Time) {
	if t.handles == nil {
		return
	}
	t.handles.Setstat(t.ctx, t.name, p, session.Attrs{Mtime: &mtime, Atime: &atime})
}

// parseItem reads "C0644 123 name" or "D0755 0 name".
func parseItem(line string) (fs.FileMode, int64, string, error) {
	f := strings.SplitN(line[1:], " ", 3)
	if len(f) != 3 {
		return 0, 0, "", fmt.Errorf("malformed line %q", line)
	}
	mode, err := strconv.ParseUint(f[0], 8, 32)
	if err != nil {
		return 0, 0, "", fmt.Errorf("malformed mode in %q", line)
	}
	size, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || size < 0 {
		return 0, 0, "", fmt.Errorf("malformed size in %q", line)
	}
	name := f[2]
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return 0, 0, "", fmt.Errorf("refusing the file name %q", name)
	}
	m := fs.FileMode(mode).Perm()
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, size, name, nil
}

// parseTimes reads "mtime 0 atime 0".
func parseTimes(s string) (time.Time, time.Time, error) {
	f := strings.Fields(s)
	if len(f) != 4 {
		return time.Time{}, time.Time{}, fmt.Errorf("malformed times %q", s)
	}
	m, err1 := strconv.ParseInt(f[0], 10, 64)
	a, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("malformed times %q", s)
	}
	return time.Unix(m, 0), time.Unix(a, 0), nil
}

// source sends files out of the session: scp -f.
func (t *scpTransfer) source() error {
	if err := t.readAck(); err != nil {
		return err
	}
	return t.send(t.args.path, true)
}

func (t *scpTransfer) send(p string, top bool) error {
	fi, err := t.svc.Stat(t.ctx, t.name, p)
	if err == nil && fi.Mode&fs.ModeSymlink != 0 && t.handles != nil {
		fi, err = t.handles.StatFollow(t.ctx, t.name, p) // scp copies what a link points to
	}
	if err != nil {
		return t.warn(fmt.Errorf("%s: %w", p, err))
	}
	if t.args.preserve {
		if _, err := fmt.Fprintf(t.w, "T%d 0 %d 0\n", fi.ModTime.Unix(), fi.ModTime.Unix()); err != nil {
			return err
		}
		if err := t.readAck(); err != nil {
			return err
		}
	}
	mode := uint32(fi.Mode.Perm())
	if fi.IsDir() {
		if !t.args.recursive {
			return t.warn(fmt.Errorf("%s: not a regular file", p))
		}
		if _, err := fmt.Fprintf(t.w, "D%04o 0 %s\n", mode, path.Base(path.Clean("/"+p))); err != nil {
			return err
		}
		if err := t.readAck(); err != nil {
			return err
		}
		ents, err := t.svc.ListDir(t.ctx, t.name, p)
		if err != nil {
			return t.warn(fmt.Errorf("%s: %w", p, err))
		}
		for _, e := range ents {
			if err := t.send(path.Join(p, e.Name), false); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprint(t.w, "E\n"); err != nil {
			return err
		}
		return t.readAck()
	}
	if !fi.Mode.IsRegular() {
		return t.warn(fmt.Errorf("%s: not a regular file", p))
	}
	rc, err := t.svc.ReadFile(t.ctx, t.name, p)
	if err != nil {
		return t.warn(fmt.Errorf("%s: %w", p, err))
	}
	defer rc.Close()
	if _, err := fmt.Fprintf(t.w, "C%04o %d %s\n", mode, fi.Size, fi.Name); err != nil {
		return err
	}
	if err := t.readAck(); err != nil {
		return err
	}
	n, err := io.Copy(t.w, io.LimitReader(rc, fi.Size))
	if err == nil && n != fi.Size {
		err = fmt.Errorf("%s changed size while being copied", p)
	}
	if err != nil {
		// The client expects size bytes: pad, then say it failed.
		io.CopyN(t.w, zeros{}, fi.Size-n)
		t.failed = true
		fmt.Fprintf(t.w, "\x01scp: %s: %s\n", p, oneLine(err))
		return t.readAck()
	}
	if err := t.ack(); err != nil {
		return err
	}
	return t.readAck()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
