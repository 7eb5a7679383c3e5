package sshd

import (
	"context"
	"fmt"

	"github.com/berthvm/berth/ui/sshd/sftp"
	"github.com/gliderlabs/ssh"
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
		fmt.Fprintf(sess.Stderr(), "berth: sftp: %s (connect as NAME@HOST, where NAME is a session: 'ssh berth@HOST ls' lists them)\n", oneLine(err))
		sess.Exit(1)
		return
	}
	log.Info("ssh: sftp")
	g := svc.(*guard) // Files and Handles, each call checked against the key's role now
	srv := &sftp.Server{
		Files:    g,
		Handles:  g,
		Name:     name,
		ReadOnly: ak.Role < Operator,
		Logger:   log,
	}
	err = srv.Serve(ctx, sftpStream{sess})
	if err != nil && ctx.Err() == nil {
		log.Info("ssh: sftp ended", "err", err)
	}
	sess.Exit(0)
}

// sftpStream is an SSH session as the stream an SFTP server reads: Close
// ends the channel so a read in flight returns.
type sftpStream struct{ ssh.Session }

func (s sftpStream) Close() error { return s.Session.Close() }
