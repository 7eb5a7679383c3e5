package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/session"
)

// errorClass ties a session error class to its wire name and status.
type errorClass struct {
	name   string
	err    error
	status int
}

// classes lists the classes in the order the server checks them.
var classes = []errorClass{
	{"not_found", session.ErrNotFound, http.StatusNotFound},
	{"exists", session.ErrExists, http.StatusConflict},
	{"invalid", session.ErrInvalid, http.StatusBadRequest},
	{"invalid_state", session.ErrInvalidState, http.StatusConflict},
	{"conflict", session.ErrConflict, http.StatusConflict},
	{"permission", session.ErrPermission, http.StatusForbidden},
	{"isolated", session.ErrIsolated, http.StatusServiceUnavailable},
	{"unavailable", session.ErrUnavailable, http.StatusServiceUnavailable},
	{"no_space", session.ErrNoSpace, http.StatusInsufficientStorage},
	{"unsupported", session.ErrUnsupported, http.StatusNotImplemented},
	{"canceled", context.Canceled, 499}, // nginx's "client closed request"
	{"timeout", context.DeadlineExceeded, http.StatusGatewayTimeout},
}

// toWire returns the status and body for err: its text, its class and
// the structure of the *session.Error in it; an errno anywhere in it is
// its code.
func toWire(err error) (int, errorBody) {
	body := errorBody{Error: err.Error()}
	var se *session.Error
	if errors.As(err, &se) {
		body.Field, body.Code, body.Msg, body.Hint = se.Field, se.Code, se.Msg, se.Hint
	}
	var errno syscall.Errno
	if body.Code == "" && errors.As(err, &errno) {
		body.Code = unix.ErrnoName(errno)
	}
	for _, c := range classes {
		if errors.Is(err, c.err) {
			body.Class = c.name
			return c.status, body
		}
	}
	return http.StatusInternalServerError, body
}

// remoteError is an error the daemon returned: its text verbatim,
// wrapping its class and, where it had one, the *session.Error rebuilt
// from its parts (with its errno), so errors.Is, errors.As and
// session.Render work as they do in-process.
type remoteError struct {
	msg   string
	class error
	se    *session.Error
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() []error {
	var out []error
	if e.se != nil {
		out = append(out, e.se)
	} else if e.class != nil {
		out = append(out, e.class)
	}
	return out
}

// fromWire turns a wire error back into an error that wraps its class.
func fromWire(status int, body errorBody) error {
	e := &remoteError{msg: body.Error}
	for _, c := range classes {
		if c.name == body.Class {
			e.class = c.err
		}
	}
	if body.Field != "" || body.Code != "" || body.Msg != "" {
		e.se = &session.Error{Class: e.class, Field: body.Field, Code: body.Code, Msg: body.Msg, Hint: body.Hint}
		if errno := errnoNamed(body.Code); errno != 0 {
			e.se.Err = errno
		}
	}
	if e.msg == "" {
		e.msg = http.StatusText(status)
	}
	return e
}

var errBadExecBody = fmt.Errorf(`exec: the request body must start with a {"request": ...} line: %w`, session.ErrInvalid)

// errnoNamed is the errno whose name is name ("ENOENT"), or 0. Errors are
// rare enough for a search.
func errnoNamed(name string) syscall.Errno {
	if !strings.HasPrefix(name, "E") {
		return 0
	}
	for n := syscall.Errno(1); n < 256; n++ {
		if unix.ErrnoName(n) == name {
			return n
		}
	}
	return 0
}
