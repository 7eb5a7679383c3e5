package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthvm/berth/session"
)

// Client is a session.Service served by a daemon over its unix socket.
// It is safe for concurrent use. Streams (Watch, Exec, Attach) end when the
// context they were started with ends.
type Client struct {
	socket string // where the daemon is, for messages: a socket path or tcp://HOST:PORT
	dial   func(ctx context.Context) (net.Conn, error)
	actor  string
	tr     *http.Transport
	hc     *http.Client
	spare  chan net.Conn // a connection Reachable made, for the next call
}

var (
	_ session.Service = (*Client)(nil)
	_ session.Imager  = (*Client)(nil)
)

// ClientOption changes a Client built by Dial.
type ClientOption func(*Client)

// WithActor names the caller ("cli", "tui") in every request, unless the
// call's context carries session.WithActor.
func WithActor(who string) ClientOption {
	return func(c *Client) { c.actor = who }
}

// Dial returns a client for the daemon listening on socketPath. It does not
// connect yet; use Ping to check that a daemon answers.
func Dial(socketPath string, opts ...ClientOption) *Client {
	return newClient(socketPath, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	}, opts...)
}

// DialTLS returns a client for the daemon listening on addr (HOST:PORT)
// over TLS with cfg: a fleet's client certificate and its CA
// (pki.ClientConfig), or a host's own to reach another host. It does
// not connect yet.
func DialTLS(addr string, cfg *tls.Config, opts ...ClientOption) *Client {
	cfg = cfg.Clone()
	if cfg.ServerName == "" {
		if h, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = h
		}
	}
	// HTTP/1.1 only: exec streams run full duplex on one connection and
	// port forwards are upgrades, as over the socket.
	cfg.NextProtos = []string{"http/1.1"}
	return newClient("tcp://"+addr, func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", addr)
	}, opts...)
}

// DialTCP returns a client for the daemon listening on addr (HOST:PORT)
// in plain text: for a fleet on loopback only, where no CA is set up.
func DialTCP(addr string, opts ...ClientOption) *Client {
	return newClient("tcp://"+addr, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, opts...)
}

func newClient(where string, dial func(ctx context.Context) (net.Conn, error), opts ...ClientOption) *Client {
	spare := make(chan net.Conn, 1)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			select {
			case c := <-spare:
				return c, nil
			default:
			}
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			return &watchedConn{Conn: c, dead: make(chan struct{})}, nil
		},
		DisableCompression:    true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // calls such as Stop take as long as they take; ctx bounds them
	}
	c := &Client{socket: where, dial: dial, tr: tr, hc: &http.Client{Transport: tr}, spare: spare}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close closes idle connections. Streams still open end with their
// contexts.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	select {
	case conn := <-c.spare:
		conn.Close()
	default:
	}
	return nil
}

// Reachable reports whether a daemon listens on the socket. It only
// connects, and keeps the connection for the next call: unlike Ping it
// costs no round trip, which a one-shot command such as berth exec would
// otherwise pay before its real call. Whether the daemon speaks this
// client's API shows on every answer (see HeaderAPI).
func (c *Client) Reachable(ctx context.Context) bool {
	conn, err := c.dial(ctx)
	if err != nil {
		return false
	}
	select {
	case c.spare <- &watchedConn{Conn: conn, dead: make(chan struct{})}:
	default:
		conn.Close() // one is kept already
	}
	return true
}

// Ping asks the daemon for its version; it fails with ErrUnavailable when
// no daemon answers on the socket.
func (c *Client) Ping(ctx context.Context) (string, error) {
	var v versionInfo
	if err := c.call(ctx, http.MethodGet, "/v1/version", nil, nil, &v); err != nil {
		return "", err
	}
	if v.API != Version {
		return v.Version, fmt.Errorf("daemon speaks API %q, this client %q: restart the daemon with this berth: %w", v.API, Version, session.ErrUnavailable)
	}
	return v.Version, nil
}

// seg escapes one path segment. "", "." and ".." cannot travel in a path
// and are no valid name or id anyway.
func seg(kind, s string) (string, error) {
	if s == "" || s == "." || s == ".." {
		return "", fmt.Errorf("invalid %s %q: %w", kind, s, session.ErrInvalid)
	}
	return url.PathEscape(s), nil
}

func sessionPath(name, suffix string) (string, error) {
	n, err := seg("session name", name)
	if err != nil {
		return "", err
	}
	return "/v1/sessions/" + n + suffix, nil
}

func execPath(id, suffix string) (string, error) {
	e, err := seg("execution id", id)
	if err != nil {
		return "", err
	}
	return "/v1/execs/" + e + suffix, nil
}

// newRequest builds a request for an already escaped path.
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Request, error) {
	u := "http://berth" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("building request %s %s: %w", method, path, err)
	}
	who := session.Actor(ctx)
	if who == "" {
		who = c.actor
	}
	if who != "" {
		req.Header.Set(HeaderBy, who)
	}
	if run := session.RunOf(ctx); run != "" {
		req.Header.Set(HeaderRun, run)
	}
	if epoch, ok := session.ForwardedOf(ctx); ok {
		req.Header.Set(HeaderForwarded, strconv.FormatInt(epoch, 10))
	}
	return req, nil
}

// do sends req and returns a 2xx response; anything else becomes an error.
// watchedConn tells when the daemon's side of a connection is gone. An exec
// stream's request body only ends when the caller sends EOF, and the HTTP
// transport waits for the body before reporting a dead connection, so the
// stream watches its connection and ends the body itself.
type watchedConn struct {
	net.Conn
	once sync.Once
	dead chan struct{}
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() { close(c.dead) })
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { close(c.dead) })
	return c.Conn.Close()
}

func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, c.transportError(req.Context(), err)
	}
	// A daemon from before HeaderAPI sends none; the version in every
	// path still keeps it from serving a call it does not know.
	if v := resp.Header.Get(HeaderAPI); v != "" && v != Version {
		resp.Body.Close()
		return nil, fmt.Errorf("daemon speaks API %q, this client %q: restart the daemon with this berth: %w", v, Version, session.ErrUnavailable)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

// transportError says the daemon could not be reached, unless the caller's
// context ended.
func (c *Client) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("cannot reach the berth daemon at %s (is 'berth serve' running?): %w: %w", c.socket, session.ErrUnavailable, err)
}

func readError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body errorBody
	if json.Unmarshal(b, &body) != nil || body.Error == "" {
		body = errorBody{Error: fmt.Sprintf("daemon answered %s: %s", resp.Status, strings.TrimSpace(string(b)))}
	}
	return fromWire(resp.StatusCode, body)
}

// call makes a JSON call: in (if not nil) is the body, out (if not nil)
// receives the answer.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		body = bytes.NewReader(frame(in))
	}
	req, err := c.newRequest(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := decodeBody(resp, out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("reading the daemon's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// List returns every session.
func (c *Client) List(ctx context.Context) ([]session.Session, error) {
	var out []session.Session
	err := c.call(ctx, http.MethodGet, "/v1/sessions", nil, nil, &out)
	return out, err
}

// Get returns one session.
// Host reports the data directory's free space against the floor.
func (c *Client) Host(ctx context.Context) (session.HostStatus, error) {
	var h session.HostStatus
	return h, c.call(ctx, http.MethodGet, "/v1/host", nil, nil, &h)
}

func (c *Client) Get(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodGet, name, "")
}

func (c *Client) sessionCall(ctx context.Context, method, name, suffix string) (session.Session, error) {
	var out session.Session
	p, err := sessionPath(name, suffix)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, method, p, nil, nil, &out)
}

// Timeline returns a session's recorded events; limit > 0 keeps the newest.
func (c *Client) Timeline(ctx context.Context, name string, limit int) ([]session.Event, error) {
	p, err := sessionPath(name, "/timeline")
	if err != nil {
		return nil, err
	}
	var q url.Values
	if limit > 0 {
		q = url.Values{"limit": {strconv.Itoa(limit)}}
	}
	var out []session.Event
	return out, c.call(ctx, http.MethodGet, p, q, nil, &out)
}

// Create makes a session.
func (c *Client) Create(ctx context.Context, opts session.CreateOptions) (session.Session, error) {
	var out session.Session
	return out, c.call(ctx, http.MethodPost, "/v1/sessions", nil, opts, &out)
}

// Pause stops the session's vCPUs; it does not flush.
func (c *Client) Pause(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, name, "/pause")
}

// Sleep snapshots an idle session to disk and releases its VM.
func (c *Client) Sleep(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, name, "/sleep")
}

// Resume continues a paused session.
func (c *Client) Resume(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, name, "/resume")
}

// Stop shuts the session's VM down cleanly.
func (c *Client) Stop(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, name, "/stop")
}

// Start boots a new VM on the session's workspace.
func (c *Client) Start(ctx context.Context, name string) (session.Session, error) {
	return c.sessionCall(ctx, http.MethodPost, name, "/start")
}

// Delete removes the session and all its storage.
func (c *Client) Delete(ctx context.Context, name string) error {
	p, err := sessionPath(name, "")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Flush makes the session's pending writes durable.
func (c *Client) Flush(ctx context.Context, name string) (session.FlushResult, error) {
	var out session.FlushResult
	p, err := sessionPath(name, "/flush")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, nil, &out)
}

// Replace gives the session a new VM with a fresh system disk on its
// retained workspace.
func (c *Client) Replace(ctx context.Context, name string, opts session.ReplaceOptions) (session.ReplaceResult, error) {
	var out session.ReplaceResult
	p, err := sessionPath(name, "/replace")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, opts, &out)
}

// Executions lists a session's running executions, or all with all.
func (c *Client) Executions(ctx context.Context, name string, all bool) ([]session.Execution, error) {
	p, err := sessionPath(name, "/executions")
	if err != nil {
		return nil, err
	}
	var out []session.Execution
	return out, c.call(ctx, http.MethodGet, p, url.Values{"all": {strconv.FormatBool(all)}}, nil, &out)
}

// Execution returns one execution's record.
func (c *Client) Execution(ctx context.Context, execID string) (session.Execution, error) {
	var out session.Execution
	p, err := execPath(execID, "")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// Output reads recorded output from fromSeq, at most limit chunks; the
// daemon caps a page at 1000 chunks (also when limit <= 0).
func (c *Client) Output(ctx context.Context, execID string, fromSeq uint64, limit int) (session.OutputPage, error) {
	var out session.OutputPage
	p, err := execPath(execID, "/output")
	if err != nil {
		return out, err
	}
	q := url.Values{"from": {strconv.FormatUint(fromSeq, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return out, c.call(ctx, http.MethodGet, p, q, nil, &out)
}

var _ session.FleetWatcher = (*Client)(nil)

// Cancel kills a running execution.
func (c *Client) Cancel(ctx context.Context, execID string) error {
	p, err := execPath(execID, "/cancel")
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodPost, p, nil, nil, nil)
}

// Watch streams events until ctx ends or the daemon goes away; then the
// channel is closed.
func (c *Client) Watch(ctx context.Context) (<-chan session.Event, error) {
	return c.WatchSince(ctx, 0)
}

// WatchSince is Watch with a fleet's changes after revision since
// (session.FleetWatcher); a daemon not in a fleet refuses a since above 0.
func (c *Client) WatchSince(ctx context.Context, since int64) (<-chan session.Event, error) {
	var q url.Values
	if since != 0 {
		q = url.Values{"since_rev": {strconv.FormatInt(since, 10)}}
	}
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/watch", q, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	ch := make(chan session.Event)
	go func() { // ends with the stream: ctx ending aborts the body read
		defer close(ch)
		defer resp.Body.Close()
		in := newFrameReader(resp.Body)
		for {
			var ev session.Event
			if err := in.next(&ev); err != nil {
				return
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func decodeJSON(r io.Reader, v any) error {
	return json.NewDecoder(io.LimitReader(r, maxAnswer)).Decode(v)
}

// maxAnswer bounds what the client reads of one JSON answer.
const maxAnswer = 64 << 20

// decodeBody decodes an answer of known length from one buffer: for a
// 1,000-session list that is 7-13 ms faster than the streaming decoder,
// whose buffer grows by doubling (measured, berth ls).
func decodeBody(resp *http.Response, v any) error {
	n := resp.ContentLength
	if n < 0 || n > maxAnswer {
		return decodeJSON(resp.Body, v)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		return err
	}
	return json.Unmarshal(buf, v)
}
