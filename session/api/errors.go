package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

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
	{"unavailable", session.ErrUnavailable, http.StatusServiceUnavailable},
	{"no_space", session.ErrNoSpace, http.StatusInsufficientStorage},
	{"canceled", context.Canceled, 499}, // nginx's "client closed request"
	{"timeout", context.DeadlineExceeded, http.StatusGatewayTimeout},
}

// toWire returns the status and body for err.
func toWire(err error) (int, errorBody) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.status, errorBody{Error: err.Error(), Class: c.name}
		}
	}
	return http.StatusInternalServerError, errorBody{Error: err.Error()}
}

// remoteError is an error the daemon returned: its message verbatim,
// wrapping the class it named.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// fromWire turns a wire error back into an error that wraps its class.
func fromWire(status int, body errorBody) error {
	e := &remoteError{msg: body.Error}
	for _, c := range classes {
		if c.name == body.Class {
			e.class = c.err
		}
	}
	if e.msg == "" {
		e.msg = http.StatusText(status)
	}
	return e
}

var errBadExecBody = fmt.Errorf(`exec: the request body must start with a {"request": ...} line: %w`, session.ErrInvalid)
