package sftp

import (
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/berthvm/berth/session"
)

// POSIX file type and mode bits, as st_mode holds them on the wire.
const (
	sIFMT   = 0o170000
	sIFSOCK = 0o140000
	sIFLNK  = 0o120000
	sIFREG  = 0o100000
	sIFBLK  = 0o060000
	sIFDIR  = 0o040000
	sIFCHR  = 0o020000
	sIFIFO  = 0o010000
	sISUID  = 0o4000
	sISGID  = 0o2000
	sISVTX  = 0o1000
)

// unixMode is m as st_mode.
func unixMode(m fs.FileMode) uint32 {
	v := uint32(m.Perm())
	switch {
	case m&fs.ModeDir != 0:
		v |= sIFDIR
	case m&fs.ModeSymlink != 0:
		v |= sIFLNK
	case m&fs.ModeNamedPipe != 0:
		v |= sIFIFO
	case m&fs.ModeSocket != 0:
		v |= sIFSOCK
	case m&fs.ModeCharDevice != 0:
		v |= sIFCHR
	case m&fs.ModeDevice != 0:
		v |= sIFBLK
	default:
		v |= sIFREG
	}
	if m&fs.ModeSetuid != 0 {
		v |= sISUID
	}
	if m&fs.ModeSetgid != 0 {
		v |= sISGID
	}
	if m&fs.ModeSticky != 0 {
		v |= sISVTX
	}
	return v
}

// permMode is the permission part of a client's st_mode (the file type
// bits are ignored, as chmod(2) ignores them).
func permMode(v uint32) fs.FileMode {
	m := fs.FileMode(v & 0o777)
	if v&sISUID != 0 {
		m |= fs.ModeSetuid
	}
	if v&sISGID != 0 {
		m |= fs.ModeSetgid
	}
	if v&sISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// fileAttrs describes fi on the wire. Owners are not known to the file
// API, so UIDGID is left out (clients show them as 0); the access time is
// the modification time.
func fileAttrs(fi session.FileInfo) wireAttrs {
	t := clampTime(fi.ModTime.Unix())
	return wireAttrs{
		flags: attrSize | attrPermissions | attrACModTime,
		size:  uint64(max(fi.Size, 0)),
		perm:  unixMode(fi.Mode),
		atime: t, mtime: t,
	}
}

// sessionAttrs turns a SETSTAT's attributes into the file API's; ok is
// false when they change nothing.
func sessionAttrs(a wireAttrs) (_ session.Attrs, ok bool, err error) {
	var s session.Attrs
	if a.flags&attrSize != 0 {
		if a.size > 1<<62 {
			return s, false, fmt.Errorf("size %d is out of range", a.size)
		}
		n := int64(a.size)
		s.Size = &n
		ok = true
	}
	if a.flags&attrUIDGID != 0 {
		uid, gid := int(a.uid), int(a.gid)
		s.UID, s.GID = &uid, &gid
		ok = true
	}
	if a.flags&attrPermissions != 0 {
		m := permMode(a.perm)
		s.Mode = &m
		ok = true
	}
	if a.flags&attrACModTime != 0 {
		at, mt := time.Unix(int64(a.atime), 0), time.Unix(int64(a.mtime), 0)
		s.Atime, s.Mtime = &at, &mt
		ok = true
	}
	return s, ok, nil
}

// modeString is m as ls -l shows it: "drwxr-xr-x".
func modeString(m fs.FileMode) string {
	var b [10]byte
	switch {
	case m&fs.ModeDir != 0:
		b[0] = 'd'
	case m&fs.ModeSymlink != 0:
		b[0] = 'l'
	case m&fs.ModeNamedPipe != 0:
		b[0] = 'p'
	case m&fs.ModeSocket != 0:
		b[0] = 's'
	case m&fs.ModeCharDevice != 0:
		b[0] = 'c'
	case m&fs.ModeDevice != 0:
		b[0] = 'b'
	default:
		b[0] = '-'
	}
	const rwx = "rwxrwxrwx"
	for i := range 9 {
		if m&(1<<(8-i)) != 0 {
			b[1+i] = rwx[i]
		} else {
			b[1+i] = '-'
		}
	}
	special := func(i int, set bool, c byte) {
		if !set {
			return
		}
		if b[i] == '-' {
			c -= 'a' - 'A' // set without execute: upper case
		}
		b[i] = c
	}
	special(3, m&fs.ModeSetuid != 0, 's')
	special(6, m&fs.ModeSetgid != 0, 's')
	special(9, m&fs.ModeSticky != 0, 't')
	return string(b[:])
}

// longName is a READDIR entry's ls -l line, as OpenSSH's sftp-server
// writes it (owners unknown: "?"); now dates it (times older than six
// months show the year).
func longName(fi session.FileInfo, now time.Time) string {
	date := fi.ModTime.Format("Jan _2 15:04")
	if d := now.Sub(fi.ModTime); d > 182*24*time.Hour || d < -182*24*time.Hour {
		date = fi.ModTime.Format("Jan _2  2006")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %4d %-8s %-8s %8d %s %s", modeString(fi.Mode), 1, "?", "?", fi.Size, date, fi.Name)
	return b.String()
}
