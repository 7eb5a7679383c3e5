package guest

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"syscall"
)

// errnoByName holds the errnos berth reports by name. The list is what file
// and exec operations can meaningfully return; anything else travels as EIO
// with its text.
var errnoByName = map[string]syscall.Errno{
	"ENOENT":       syscall.ENOENT,
	"EEXIST":       syscall.EEXIST,
	"EISDIR":       syscall.EISDIR,
	"ENOTDIR":      syscall.ENOTDIR,
	"ENOSPC":       syscall.ENOSPC,
	"EDQUOT":       syscall.EDQUOT,
	"EACCES":       syscall.EACCES,
	"EPERM":        syscall.EPERM,
	"ENOTEMPTY":    syscall.ENOTEMPTY,
	"EINVAL":       syscall.EINVAL,
	"EIO":          syscall.EIO,
	"EROFS":        syscall.EROFS,
	"ENAMETOOLONG": syscall.ENAMETOOLONG,
	"ELOOP":        syscall.ELOOP,
	"EXDEV":        syscall.EXDEV,
	"EBUSY":        syscall.EBUSY,
	"EFBIG":        syscall.EFBIG,
	"ENOEXEC":      syscall.ENOEXEC,
	"ETXTBSY":      syscall.ETXTBSY,
	"ESRCH":        syscall.ESRCH,
	"ENOMEM":       syscall.ENOMEM,
	"EBADF":        syscall.EBADF,
	"EMFILE":       syscall.EMFILE,
	"EMLINK":       syscall.EMLINK,
	"ENXIO":        syscall.ENXIO,
	"EOPNOTSUPP":   syscall.EOPNOTSUPP, // ENOTSUP too, on Linux
	"ECONNREFUSED": syscall.ECONNREFUSED,
	"ETIMEDOUT":    syscall.ETIMEDOUT,
}

// ErrorFrom converts a Go error into an agent Error, keeping the errno.
func ErrorFrom(op, path string, err error) *Error {
	var ge *Error
	if errors.As(err, &ge) {
		return ge
	}
	e := &Error{Code: "EIO", Op: op, Path: path, Message: err.Error()}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		e.Message = pe.Err.Error()
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		e.Message = le.Err.Error()
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		for name, v := range errnoByName {
			if v == errno {
				e.Code = name
				return e
			}
		}
	}
	switch {
	case errors.Is(err, ErrEscape):
		e.Code = CodeEscape
	case errors.Is(err, ErrNoWorkspace):
		e.Code = CodeNoWorkspace
	case errors.Is(err, ErrUnknownExec):
		e.Code = CodeUnknownExec
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, exec.ErrNotFound):
		e.Code = "ENOENT"
	case errors.Is(err, fs.ErrExist):
		e.Code = "EEXIST"
	case errors.Is(err, fs.ErrPermission):
		e.Code = "EACCES"
	}
	return e
}
