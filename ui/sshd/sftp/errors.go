package sftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"syscall"

	"github.com/berthvm/berth/session"
)

// statusError is a reply status with its message: handlers return it to
// say exactly which status a failure gets.
type statusError struct {
	code uint32
	msg  string
}

func (e *statusError) Error() string { return e.msg }

func status(code uint32, format string, args ...any) error {
	return &statusError{code, fmt.Sprintf(format, args...)}
}

// Errors of the protocol itself.
var (
	errBadHandle = status(fxFailure, "invalid handle")
	errReadOnly  = status(fxPermissionDenied, "read-only: a viewer may not change files")
)

// maxMessage bounds a status message: the file API's errors can quote
// guest text.
const maxMessage = 512

// statusOf gives err its SFTP status, as OpenSSH's sftp-server maps errno
// (errno_to_portable), then by berth's error classes for errors that name
// no errno. Paths that lead out of /workspace are PERMISSION_DENIED, as a
// chroot refuses them.
func statusOf(err error) (uint32, string) {
	if err == nil {
		return fxOK, ""
	}
	msg := oneLine(err.Error())
	var se *statusError
	if errors.As(err, &se) {
		return se.code, msg
	}
	switch {
	case errors.Is(err, io.EOF):
		return fxEOF, "end of file"
	case isEscape(err):
		return fxPermissionDenied, msg
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.EBADF), errors.Is(err, syscall.ELOOP):
		return fxNoSuchFile, msg
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fxPermissionDenied, msg
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		return fxBadMessage, msg
	case errors.Is(err, syscall.ENOSYS), errors.Is(err, syscall.EOPNOTSUPP):
		return fxOpUnsupported, msg
	case hasErrno(err):
		return fxFailure, msg // EEXIST, ENOTEMPTY, ENOSPC, EISDIR…
	case errors.Is(err, session.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fxNoSuchFile, msg
	case errors.Is(err, session.ErrPermission), errors.Is(err, fs.ErrPermission):
		return fxPermissionDenied, msg
	case errors.Is(err, session.ErrUnavailable):
		return fxNoConnection, msg
	case errors.Is(err, errors.ErrUnsupported):
		return fxOpUnsupported, msg
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fxFailure, msg
	}
	return fxFailure, msg
}

func hasErrno(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno)
}

// isEscape reports a path refused because it leads out of /workspace, by
// its code (which the socket API carries).
func isEscape(err error) bool { return session.CodeOf(err) == session.CodeEscape }

// oneLine flattens and bounds a message.
func oneLine(s string) string {
	// A status message is UTF-8 (filexfer-02 section 7), and may quote
	// the client's path bytes or guest text, which need not be.
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	if len(s) > maxMessage {
		s = strings.ToValidUTF8(s[:maxMessage], "") + "…"
	}
	return s
}
