// Package sshd serves berth over SSH: the terminal UI to clients with a
// PTY, the CLI's commands to clients without one, and sftp onto a
// session's /workspace. Only public keys listed in <data>/ssh/authorized_keys
// log in, each with a role (viewer, operator, admin) that the server
// enforces on every call it makes to the session.Service.
package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/berthvm/berth/session"
)

// Options configure a Server. Every zero value means its documented
// default.
type Options struct {
	// Dir holds the host key (host_ed25519, generated on first use) and
	// authorized_keys: <data>/ssh. Required.
	Dir string
	// Logger receives connection, authentication and session records;
	// nil discards them.
	Logger *slog.Logger
	// Out receives the lines meant for the person who started the server
	// (address and host key fingerprint); nil discards them.
	Out io.Writer
	// DaemonStatus, if set, is shown in the footer of SSH TUIs.
	DaemonStatus func() string

	// MaxConns bounds concurrent connections, authenticated or not;
	// 0 means 64.
	MaxConns int
	// RatePerIP and BurstPerIP bound new connections from one remote IP:
	// BurstPerIP at once, then RatePerIP per second. 0 means 4 per second
	// with bursts of 32; a negative RatePerIP disables the limit.
	RatePerIP  float64
	BurstPerIP int
	// HandshakeTimeout bounds key exchange plus authentication; 0 means
	// 20s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that received nothing from its
	// client for this long while no command runs on it (a TUI nobody
	// touches, an idle sftp); 0 means 30m.
	IdleTimeout time.Duration
	// RecheckEvery is how often a connection checks that its key is still
	// in authorized_keys; connections of a removed key are closed. Every
	// call a connection makes is also checked. 0 means 2s.
	RecheckEvery time.Duration
	// ShutdownTimeout is how long Serve, once its context ends, lets
	// commands and transfers finish before it closes their connections
	// (TUIs are asked to quit at once); 0 means 5s.
	ShutdownTimeout time.Duration
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 64
	}
	if o.RatePerIP == 0 {
		o.RatePerIP = 4
	}
	if o.BurstPerIP <= 0 {
		o.BurstPerIP = 32
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 20 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Minute
	}
	if o.RecheckEvery <= 0 {
		o.RecheckEvery = 2 * time.Second
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
}

// Server is berth's SSH server. Create it with New and run it with Serve.
type Server struct {
	svc     session.Service
	opts    Options
	log     *slog.Logger
	host    gossh.Signer
	keys    *keyring
	limiter *rateLimiter
	srv     *ssh.Server

	// closing is closed when Serve's context ends: TUIs quit, new
	// sessions are refused.
	closing chan struct{}

	mu       sync.Mutex
	conns    map[*conn]struct{}
	shut     bool
	served   bool
	handlers sync.WaitGroup // session and subsystem handlers
}

// New returns a server for svc, loading (or generating) the host key in
// opts.Dir.
func New(svc session.Service, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("sshd: Options.Dir is required (<data>/ssh): %w", session.ErrInvalid)
	}
	opts.defaults()
	host, created, err := LoadHostKey(opts.Dir)
	if err != nil {
		return nil, err
	}
	log := opts.Logger.With("component", "ssh")
	if created {
		log.Info("generated the SSH host key", "file", filepath.Join(opts.Dir, HostKeyFile), "fingerprint", gossh.FingerprintSHA256(host.PublicKey()))
	}
	s := &Server{
		svc:     svc,
		opts:    opts,
		log:     log,
		host:    host,
		keys:    newKeyring(filepath.Join(opts.Dir, AuthorizedKeysFile), log),
		limiter: newRateLimiter(opts.RatePerIP, opts.BurstPerIP),
		closing: make(chan struct{}),
		conns:   map[*conn]struct{}{},
	}
	s.srv = &ssh.Server{
		Version:              "berth",
		HostSigners:          []ssh.Signer{host},
		Handler:              s.handleSession,
		PublicKeyHandler:     s.publicKeyHandler,
		ConnCallback:         s.connCallback,
		ServerConfigCallback: s.serverConfig,
		ChannelHandlers:      map[string]ssh.ChannelHandler{"session": ssh.DefaultSessionHandler, "direct-tcpip": s.handleDirectTCPIP},
		RequestHandlers:      map[string]ssh.RequestHandler{},
		SubsystemHandlers:    map[string]ssh.SubsystemHandler{"sftp": s.handleSFTP},
		ConnectionFailedCallback: func(c net.Conn, err error) {
			log.Info("ssh: connection failed", "remote", c.RemoteAddr().String(), "err", err)
		},
	}
	return s, nil
}

// HostKey returns the server's public host key.
func (s *Server) HostKey() gossh.PublicKey { return s.host.PublicKey() }

// Serve accepts connections on ln until ctx ends, then shuts down: it
// stops accepting, asks TUIs to quit, lets commands and transfers run for
// ShutdownTimeout, closes every connection, and returns once the session
// handlers have ended (or after another ShutdownTimeout, logging that some
// had not; they end as their connections' closing reaches them). It returns nil after a shutdown, or the listener's error. A
// Server serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return fmt.Errorf("sshd: Serve called twice: %w", session.ErrInvalidState)
	}
	s.served = true
	s.mu.Unlock()

	fmt.Fprintf(s.opts.Out, "berth ssh: listening on %s, host key %s (%s)\n",
		ln.Addr(), gossh.FingerprintSHA256(s.host.PublicKey()), s.host.PublicKey().Type())
	s.log.Info("ssh: serving", "addr", ln.Addr().String(), "fingerprint", gossh.FingerprintSHA256(s.host.PublicKey()))
	if n := s.keys.count(); n == 0 {
		fmt.Fprintf(s.opts.Out, "berth ssh: no key may log in yet; add one with 'berth ssh add-key --role admin ~/.ssh/id_ed25519.pub'\n")
	} else {
		fmt.Fprintf(s.opts.Out, "berth ssh: %d authorized key(s) in %s\n", n, s.keys.path)
	}

	// gliderlabs' Shutdown must not run before Serve tracked the
	// listener (it would race on a WaitGroup and miss the listener); the
	// first Accept call says it did.
	sl := &startedListener{Listener: ln, started: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(sl) }()
	var err error
	select {
	case err = <-served:
		served = nil
	case <-ctx.Done():
		select {
		case <-sl.started:
		case err = <-served:
			served = nil
		}
	}
	s.shutdown()
	ln.Close()
	if served != nil {
		<-served
	}
	if errors.Is(err, ssh.ErrServerClosed) {
		err = nil
	}
	return err
}

// startedListener reports the first Accept call.
type startedListener struct {
	net.Listener
	once    sync.Once
	started chan struct{}
}

func (l *startedListener) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.started) })
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return withQuickAck(c), nil
}

// shutdown runs the ordered shutdown Serve documents.
func (s *Server) shutdown() {
	s.mu.Lock()
	s.shut = true
	s.mu.Unlock()
	close(s.closing)
	// Connections still authenticating have started nothing: drop them
	// first, so none completes its handshake while the ssh server shuts
	// down (it is not told about them until then).
	s.closeConns(func(c *conn) bool { return c.key.Load() == nil })
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	err := s.srv.Shutdown(sctx)
	cancel()
	if err != nil {
		s.log.Info("ssh: closing connections still open after the shutdown timeout", "timeout", s.opts.ShutdownTimeout)
	}
	s.srv.Close()
	s.closeConns(func(*conn) bool { return true })
	done := make(chan struct{})
	go func() { // ends when the last handler does
		s.handlers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(s.opts.ShutdownTimeout):
		s.log.Warn("ssh: session handlers still ending after shutdown; continuing")
	}
}

// closeConns closes the connections which.
func (s *Server) closeConns(which func(*conn) bool) {
	s.mu.Lock()
	var cs []*conn
	for c := range s.conns {
		if which(c) {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.shut("the server is shutting down")
	}
}

// begin registers a session handler; false means the server is shutting
// down.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shut {
		return false
	}
	s.handlers.Add(1)
	return true
}

type connKey struct{}

// connCallback admits a new connection within the limits.
func (s *Server) connCallback(ctx ssh.Context, nc net.Conn) net.Conn {
	now := time.Now()
	ip := remoteIP(nc.RemoteAddr())
	if !s.limiter.allow(ip, now) {
		s.refuse(nc, "too many new connections from "+ip+"; try again in a few seconds")
		return nil
	}
	c := &conn{Conn: nc, s: s, ip: ip, start: now}
	c.lastRead.Store(now.UnixNano())
	s.mu.Lock()
	switch {
	case s.shut:
		s.mu.Unlock()
		s.refuse(nc, "the server is shutting down; try again shortly")
		return nil
	case len(s.conns) >= s.opts.MaxConns:
		s.mu.Unlock()
		s.refuse(nc, fmt.Sprintf("the server has its maximum of %d connections; try again later", s.opts.MaxConns))
		return nil
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	ctx.SetValue(connKey{}, c)
	c.arm(s.opts.HandshakeTimeout)
	return c
}

// refuse tells a client in one line why it is turned away (SSH clients
// show lines before the protocol version) and logs it.
func (s *Server) refuse(nc net.Conn, why string) {
	s.log.Info("ssh: connection refused", "remote", nc.RemoteAddr().String(), "reason", why)
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	io.WriteString(nc, "berth: "+why+"\r\n")
}

// connClosed gives a connection's slot back.
func (s *Server) connClosed(c *conn, reason string) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if reason != "" {
		s.log.Info("ssh: connection closed by the server", "remote", c.RemoteAddr().String(), "reason", reason)
	}
}

func remoteIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// serverConfig sets what gliderlabs/ssh does not: the callback that sees
// the key a client proved it holds, and the auth attempt limit.
func (s *Server) serverConfig(ctx ssh.Context) *gossh.ServerConfig {
	return &gossh.ServerConfig{
		MaxAuthTries: 6,
		VerifiedPublicKeyCallback: func(md gossh.ConnMetadata, key gossh.PublicKey, _ *gossh.Permissions, _ string) (*gossh.Permissions, error) {
			ak, err := s.keys.lookup(key)
			if err != nil {
				return nil, err
			}
			c, _ := ctx.Value(connKey{}).(*conn)
			if c == nil {
				return nil, errors.New("berth: connection state lost")
			}
			c.authenticated(key)
			s.log.Info("ssh: authenticated", "remote", md.RemoteAddr().String(), "key", ak.Fingerprint, "name", ak.Name(), "role", ak.Role.String())
			// A fresh Permissions: nothing from earlier attempts leaks in.
			return &gossh.Permissions{Extensions: map[string]string{"berth-key": ak.Fingerprint}}, nil
		},
	}
}

// publicKeyHandler answers "would this key be accepted?"; it is also asked
// for keys a client only offers. Identity is taken from the verified key
// only (serverConfig), and checked again in every handler.
func (s *Server) publicKeyHandler(ctx ssh.Context, key ssh.PublicKey) bool {
	if _, ok := key.(*gossh.Certificate); ok {
		return false
	}
	if _, err := s.keys.lookup(key); err != nil {
		s.log.Debug("ssh: key refused", "remote", ctx.RemoteAddr().String(), "key", gossh.FingerprintSHA256(key), "user", ctx.User())
		return false
	}
	s.log.Debug("ssh: key offered and acceptable", "remote", ctx.RemoteAddr().String(), "key", gossh.FingerprintSHA256(key))
	return true
}

// identify re-verifies a session's key against the one the connection
// proved it holds and against the current authorized_keys
// (CVE-2024-45337: never trust what an earlier auth callback saw).
func (s *Server) identify(sess ssh.Session) (AuthorizedKey, *conn, error) {
	c, _ := sess.Context().Value(connKey{}).(*conn)
	if c == nil {
		return AuthorizedKey{}, nil, fmt.Errorf("connection state lost: %w", session.ErrPermission)
	}
	kp := c.key.Load()
	if kp == nil {
		return AuthorizedKey{}, nil, fmt.Errorf("the connection did not authenticate with a key: %w", session.ErrPermission)
	}
	if !ssh.KeysEqual(sess.PublicKey(), *kp) {
		offered := "none"
		if pk := sess.PublicKey(); pk != nil {
			offered = gossh.FingerprintSHA256(pk)
		}
		s.log.Warn("ssh: session key differs from the verified key; refused", "remote", c.RemoteAddr().String(),
			"verified", gossh.FingerprintSHA256(*kp), "session", offered)
		return AuthorizedKey{}, nil, fmt.Errorf("the session's key is not the key that authenticated: %w", session.ErrPermission)
	}
	ak, err := s.keys.lookup(*kp)
	if err != nil {
		return AuthorizedKey{}, nil, err
	}
	return ak, c, nil
}

// serviceFor returns the Service as the key may use it: its role is looked
// up on every call, every call is recorded as the key.
func (s *Server) serviceFor(ak AuthorizedKey) session.Service { return s.guardFor(ak) }

func (s *Server) guardFor(ak AuthorizedKey) *guard {
	return &guard{svc: s.svc, who: ak.Actor(), role: func(context.Context) (Role, error) {
		return s.currentRole(ak.Key)
	}}
}

// currentRole is key's role in authorized_keys now.
func (s *Server) currentRole(key gossh.PublicKey) (Role, error) {
	ak, err := s.keys.lookup(key)
	if err != nil {
		return 0, err
	}
	return ak.Role, nil
}
