// Package api is the daemon's versioned HTTP/JSON API over a unix socket:
// NewServer serves a session.Service, Dial returns a Client that is one.
//
// Plain calls are JSON in and out. Errors are a status code and
// {"error": "...", "class": "not_found"}; the client turns them back into
// errors that wrap the session error classes, with the message verbatim.
// Streams (GET /v1/watch, exec and attach output) are NDJSON, one frame per
// line, flushed as they happen. POST /v1/sessions/{name}/exec is full
// duplex: the request body carries a request frame, then stdin, EOF and
// resize frames while the response carries output frames and ends with the
// execution's final record. POST /v1/images streams build progress as
// NDJSON and ends with the image or an error (see buildFrame).
//
// GET /v1/images/{name}/export streams NDJSON progress while the export
// is prepared, then the export's description (exportFrame), then the
// tarball's bytes, exactly as many as it says, then the trailer a tree's
// tar ends with.
//
// Trees travel as bare tar streams. A PUT to .../tree/{dir} answers once
// the Service has made every file durable. A GET of .../tree/{path} sends
// the tar chunked and ends with an HTTP trailer: X-Berth-End: ok, or
// X-Berth-Error with the error as JSON (class kept), so an error after
// the stream began reaches the client as one, never as a short tar.
//
// What the Service behind it does not do (the fake builds no images) is
// answered with the class "unsupported" (501), as ErrUnsupported.
//
// The client names its caller in the X-Berth-By header; the server passes
// it on with session.WithActor.
//
// Routes:
//
//	GET    /v1/version                                {"api":"v1","version":...}
//	GET    /v1/watch                                  NDJSON session.Event stream (?since_rev=N: a fleet's changes after revision N)
//	GET    /v1/host                                   HostStatus
//	GET    /v1/hosts                                  HostList (the fleet's hosts; fleet false: not in one)
//	POST   /v1/hosts/{id}/drain                       NDJSON drainFrame stream: a DrainStep per session, then the DrainResult
//	POST   /v1/hosts/{id}/undrain                     204: placement may pick the host again
//	GET    /v1/sessions                               []Session
//	POST   /v1/sessions                               CreateOptions → 201 Session
//	GET    /v1/sessions/{name}                        Session
//	DELETE /v1/sessions/{name}                        204
//	POST   /v1/sessions/{name}/pause                  Session
//	POST   /v1/sessions/{name}/sleep                  Session
//	POST   /v1/sessions/{name}/resume                 Session
//	POST   /v1/sessions/{name}/stop                   Session
//	POST   /v1/sessions/{name}/start                  Session
//	POST   /v1/sessions/{name}/flush                  FlushResult
//	POST   /v1/sessions/{name}/replace                ReplaceOptions (body optional) → ReplaceResult
//	GET    /v1/sessions/{name}/timeline               ?limit=N → []Event
//	GET    /v1/sessions/{name}/history                []Sample (the last HistoryWindow)
//	GET    /v1/sessions/{name}/net                    NetStatus
//	PUT    /v1/sessions/{name}/net                    {"policy"} → Session
//	GET    /v1/sessions/{name}/forward/{port}         upgrade: a byte stream to the guest's 127.0.0.1:port
//	POST   /v1/sessions/{name}/checkpoints            CheckpointOptions → 201 Checkpoint
//	GET    /v1/sessions/{name}/checkpoints            []Checkpoint
//	DELETE /v1/sessions/{name}/checkpoints/{id}       204
//	POST   /v1/sessions/{name}/restore                {"id"} → RestoreResult
//	POST   /v1/sessions/{name}/fork                   {"name"} → 201 ForkResult
//	GET    /v1/sessions/{name}/diff                   ?from=ID&to=ID&patch=true&path=P… → Diff (no to: with now)
//	POST   /v1/sessions/{name}/exec                   full duplex NDJSON (see inFrame, outFrame)
//	GET    /v1/sessions/{name}/executions             ?all=true → []Execution
//	GET    /v1/execs/{id}                             Execution
//	GET    /v1/execs/{id}/output                      ?from=S&limit=N → OutputPage (at most 1000 chunks)
//	GET    /v1/execs/{id}/attach                      ?from=S → output stream
//	POST   /v1/execs/{id}/attach                      ?from=S → output stream, duplex (stdin, resize)
//	POST   /v1/execs/{id}/cancel                      204
//	GET    /v1/sessions/{name}/files/{path...}        content; ?op=stat FileInfo, ?op=list []FileInfo
//	PUT    /v1/sessions/{name}/files/{path...}        body → {"written":N}, once durable
//	POST   /v1/sessions/{name}/files/{path...}        ?op=mkdir 204; ?op=rename&to=PATH 204
//	DELETE /v1/sessions/{name}/files/{path...}        204
//	GET    /v1/sessions/{name}/tree/{path...}         tar of the file or tree, then a trailer
//	PUT    /v1/sessions/{name}/tree/{path...}         tar body → CopyResult, once durable
//	GET    /v1/images                                 []ImageInfo
//	POST   /v1/images                                 BuildRequest → NDJSON build stream (see buildFrame)
//	POST   /v1/images/{name}/import                   ?source=PATH|-&ref=R, body: the image for - → NDJSON build stream
//	POST   /v1/images/{name}/commit                   {"session","label"} → 201 CommitResult
//	GET    /v1/images/{name}/export                   ?digest=D → NDJSON progress, the ImageExport, its tarball's bytes, a trailer
//	DELETE /v1/images/{name}                          204
//	POST   /v1/sessions/{name}/runs                   RunOptions → 201 Run
//	GET    /v1/sessions/{name}/runs                   []Run
//	GET    /v1/runs/{id}                              Run with its executions' ids
//	POST   /v1/runs/{id}/end                          {"status":S} → Run
//	DELETE /v1/runs/{id}                              RemovedRun: the record and its starting point removed
//	GET    /v1/runs/{id}/diff                         ?patch=true&path=P… → Diff against the run's starting point
//	POST   /v1/runs/{id}/undo                         {"paths":[…]} (none: all) → UndoResult
//	POST   /v1/sessions/{name}/schedules              ScheduleRequest → 201 Schedule
//	GET    /v1/sessions/{name}/schedules              []Schedule
//	DELETE /v1/sessions/{name}/schedules/{id}         204
//	GET    /v1/sessions/{name}/bundle                 a stopped or sleeping session's move bundle (cut off on error)
//	POST   /v1/sessions/{name}/drop                   204: the copy of a session moved to another host removed
//	GET    /v1/sessions/{name}/image-bundle           the image build the session was made on, as a bundle (cut off on error)
//	POST   /v1/sessions/{name}/move                   {"to"} → MoveResult: the session moved to host to (a fleet's)
//	POST   /v1/moves                                  a move bundle → 201 MoveStaged
//	POST   /v1/moves/images                           an image build's bundle → 204 (409: here already)
//	POST   /v1/moves/{name}/commit                    Session: the staged session made this host's
//	DELETE /v1/moves/{name}                           204: the staged session removed
//	POST   /v1/sessions/{name}/checkpoints/{id}/replicate {"to"} → Replica: the checkpoint copied to host to (a fleet's)
//	POST   /v1/sessions/{name}/recover                RecoverOptions → RecoverResult: a gone host's session started from a replica
//	GET    /v1/sessions/{name}/checkpoints/{id}/bundle a checkpoint's replica bundle (cut off on error)
//	POST   /v1/replicas                               a replica bundle → 201 Replica
//	GET    /v1/replicas                               ?session=NAME → []Replica: the replicas this host keeps
//	POST   /v1/replicas/{name}/{id}/stage             MoveStaged: the replica staged for a recovery
//	DELETE /v1/replicas/{name}/{id}                   204: the replica removed
//
// The run routes need a Service that is also a session.Harness (the
// Manager is). A call made in an agent run names it in the X-Berth-Run
// header; the server passes it on with session.WithRun.
package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/berthvm/berth/session"
)

// HeaderBy carries who makes a call ("cli", "tui").
const HeaderBy = "X-Berth-By"

// HeaderAPI carries, on every answer, the API version the daemon speaks,
// so a client learns a mismatch from its first call instead of a ping.
const HeaderAPI = "X-Berth-API"

// HeaderRun carries the agent run a call counts in.
const HeaderRun = "X-Berth-Run"

// HeaderForwarded marks a call a fleet's front door forwards to the
// session's owner, with the session's epoch (0: a call on no one
// session). See session.WithForwarded.
const HeaderForwarded = "X-Berth-Forwarded"

// Version is the API version, the first element of every path.
const Version = "v1"

// maxFrame bounds one NDJSON line in either direction; output chunks and
// stdin frames are far smaller.
const maxFrame = 4 << 20

// maxStdinFrame bounds the stdin bytes in one frame.
const maxStdinFrame = 32 << 10

// maxJSONBody bounds a plain JSON request body.
const maxJSONBody = 1 << 20

// versionInfo is the body of GET /v1/version.
type versionInfo struct {
	API     string `json:"api"`
	Version string `json:"version"`
}

// errorBody is an error on the wire.
type errorBody struct {
	Error string `json:"error"`
	Class string `json:"class,omitempty"`
	// The structure of a *session.Error in it (its text is in Error):
	// the field at fault, a code (an errno's name or session's Code
	// constants), the message without the field, and the hint.
	Field string `json:"field,omitempty"`
	Code  string `json:"code,omitempty"`
	Msg   string `json:"msg,omitempty"`
	Hint  string `json:"hint,omitempty"`
}

// inFrame is one line of an exec or attach request body. The exec body
// starts with a Request frame.
type inFrame struct {
	Request *session.ExecRequest `json:"request,omitempty"`
	Stdin   []byte               `json:"stdin,omitempty"`
	EOF     bool                 `json:"eof,omitempty"`
	Resize  *termSize            `json:"resize,omitempty"`
}

type termSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// outFrame is one line of an exec or attach response. The first frame
// names the execution; the last is Exit or Error.
type outFrame struct {
	ID    string             `json:"id,omitempty"`
	TTY   bool               `json:"tty,omitempty"`
	Chunk *session.Chunk     `json:"chunk,omitempty"`
	Exit  *session.Execution `json:"exit,omitempty"`
	Error *errorBody         `json:"error,omitempty"`
}

// written is the body of a PUT to a file.
type written struct {
	Written int64 `json:"written"`
}

// buildFrame is one line of an image build's response: progress as it
// happens, then Image or Error.
type buildFrame struct {
	Progress *session.BuildProgress `json:"progress,omitempty"`
	Image    *session.ImageInfo     `json:"image,omitempty"`
	Error    *errorBody             `json:"error,omitempty"`
}

// exportFrame is one line of an image export's response, before its
// bytes: progress while the export is prepared, then Export (the
// tarball's description: exactly Export.Size bytes of it follow the
// line, then a trailer) or Error.
type exportFrame struct {
	Progress *session.BuildProgress `json:"progress,omitempty"`
	Export   *session.ImageExport   `json:"export,omitempty"`
	Error    *errorBody             `json:"error,omitempty"`
}

// Trailers of a tar stream sent by GET .../tree/{path} or an image
// export: exactly one of them ends a stream that was not cut off.
const (
	trailerEnd   = "X-Berth-End"   // "ok"
	trailerError = "X-Berth-Error" // errorBody as JSON
)

// frameReader reads NDJSON frames of bounded size.
type frameReader struct {
	r *bufio.Reader
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

var errFrameTooLarge = fmt.Errorf("stream frame larger than %d bytes: %w", maxFrame, session.ErrInvalid)

// next decodes the next non-empty line into v. At the end of the stream it
// returns io.EOF; a cut-off line is io.ErrUnexpectedEOF.
func (fr *frameReader) next(v any) error {
	var line []byte
	for {
		part, err := fr.r.ReadSlice('\n')
		if len(line)+len(part) > maxFrame {
			return errFrameTooLarge
		}
		line = append(line, part...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0:
			return io.ErrUnexpectedEOF
		case err != nil:
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			line = line[:0]
			continue
		}
		if err := json.Unmarshal(line, v); err != nil {
			return fmt.Errorf("bad stream frame: %w", err)
		}
		return nil
	}
}

// frame encodes v as one NDJSON line.
func frame(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("api: encoding %T: %v", v, err)) // only our own wire types get here
	}
	return append(b, '\n')
}

// pollInterval is how often a client asks for an execution's state when it
// cannot learn it from a stream.
const pollInterval = 250 * time.Millisecond
