package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/gliderlabs/ssh"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/cli"
)

// Each session is an SSH host: the user name picks it. `ssh NAME@HOST`
// opens a login shell in it, `ssh NAME@HOST CMD` runs CMD there with its
// own stdin, stdout, stderr and exit status — what rsync, git, scp -O and
// coding-agent harnesses expect of a remote machine. These run outside
// berth's coordination and are recorded as such. The workbench (the TUI
// and berth's commands) answers as berth@HOST. A name that is no session
// reaches the workbench only without a command (`ssh -t HOST` sends the
// local login name): with one it is a mistyped session name, and running
// the command on the workbench would act on berth ("typo@HOST stop x"
// stops session x).

// workbenchUser is the user name that always reaches the workbench; no
// session may be called so (session.ValidateName refuses it).
const workbenchUser = session.ReservedName

// sessionFor returns the session the connection's user name names; false
// with a nil error means the name is the workbench's or names no session.
func (s *Server) sessionFor(ctx context.Context, user string) (session.Session, bool, error) {
	if user == workbenchUser || session.ValidateName(user) != nil {
		return session.Session{}, false, nil
	}
	got, err := s.svc.Get(ctx, user)
	switch {
	case errors.Is(err, session.ErrNotFound):
		return session.Session{}, false, nil
	case err != nil:
		return session.Session{}, false, err
	}
	return got, true, nil
}

// noSession is the answer to a command sent as a user that names no
// session. SSH does not carry the host name the client typed, so the
// workbench is named by the address the client reached.
func noSession(user string, local net.Addr) string {
	host, _, err := net.SplitHostPort(local.String())
	if err != nil {
		host = local.String()
	}
	return fmt.Sprintf("no session %q (the workbench is %s@%s)", user, workbenchUser, host)
}

// loginScript runs the session's login shell: bash where the image has it
// (debian), else sh.
const loginScript = `if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l`

// runInSession serves a shell or command in session sn.
func (s *Server) runInSession(sess ssh.Session, ak AuthorizedKey, sn session.Session, pty ssh.Pty, sizes <-chan ssh.Window, isPty bool) int {
	svc := s.serviceFor(ak)
	var stderr io.Writer = sess.Stderr()
	if isPty {
		stderr = crlfWriter{stderr} // the client's terminal is raw
	}
	say := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "berth: "+format+"\n", a...)
		return cli.ExitFailed
	}
	role, err := s.currentRole(ak.Key)
	if err != nil {
		return say("%s", oneLine(err))
	}
	if err := session.Permit(role, session.ActionExec); err != nil {
		return say("%s; %s@ logs you in to the session's shell, which viewers may not (sftp %s@HOST reads its files)", oneLine(err), sn.Name, sn.Name)
	}
	switch sn.State {
	case session.StateStopped, session.StateCrashed:
		return say("session %s is %s: start it first ('ssh berth@HOST start %s', or berth start %s on the daemon's host)", sn.Name, sn.State, sn.Name, sn.Name)
	case session.StatePaused:
		return say("session %s is paused (%s): resume it first ('ssh berth@HOST resume %s')", sn.Name, sn.Cause, sn.Name)
	}
	raw := sess.RawCommand()
	if isSCP(sess.Command()) {
		return s.runSCP(sess, svc, sn, sess.Command())
	}
	req := session.ExecRequest{Argv: []string{"/bin/sh", "-c", loginScript}, Stdin: true, Outside: true, TTY: isPty}
	if strings.TrimSpace(raw) != "" {
		// As sshd does: the command line goes to the shell as one string.
		req.Argv = []string{"/bin/sh", "-c", raw}
	}
	env := cli.Env{
		Stdin: sess, Stdout: sess, Stderr: stderr,
		Connect:  func(context.Context) (session.Service, error) { return svc, nil },
		StdinTTY: isPty, StdoutTTY: isPty, StderrTTY: isPty,
		Who: ak.Actor(), NoLocalFiles: true,
	}
	if isPty {
		env.Size = cli.TermSize{Rows: pty.Window.Height, Cols: pty.Window.Width}
		env.Term = pty.Term
		env.SizeChanges = sizeChanges(sizes)
	}
	// The client's environment that makes sense in the guest (LANG, and
	// what a harness sets with SendEnv/SetEnv).
	for _, kv := range sess.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" && !strings.HasPrefix(k, "SSH_") && k != "PATH" && k != "HOME" {
			if req.Env == nil {
				req.Env = map[string]string{}
			}
			req.Env[k] = v
		}
	}
	code := cli.Execute(sess.Context(), env, sn.Name, req)
	if code == 127 && strings.TrimSpace(raw) != "" {
		s.notFound(sess.Context(), svc, sn, raw, stderr)
	}
	return code
}

// notFound explains a command the session's image lacks, the way a client
// that needs it (rsync, git) can show its user.
func (s *Server) notFound(ctx context.Context, svc session.Service, sn session.Session, raw string, stderr io.Writer) {
	prog := firstWord(raw)
	if prog == "" || strings.ContainsAny(prog, "/$`'\"\\") {
		return
	}
	// Ask the guest whether the program exists at all: a command's own
	// exit 127 is not ours to explain.
	p, err := svc.Exec(ctx, sn.Name, session.ExecRequest{Argv: []string{"/bin/sh", "-c", "command -v " + prog + " >/dev/null"}, Outside: true})
	if err != nil {
		return
	}
	for range p.Output() {
	}
	x, err := p.Wait(ctx)
	if err != nil || x.ExitCode == nil || *x.ExitCode == 0 {
		return
	}
	hint := "install it in the session, or build an image that has it (berth image build --recipe)"
	if sn.Image == "mini" {
		hint = "use --image debian"
	}
	fmt.Fprintf(stderr, "%s: not found in session %s (image %s); %s\n", prog, sn.Name, sn.Image, hint)
}

// firstWord is the program a shell command line starts, when it is a
// plain word (after NAME=value assignments).
func firstWord(raw string) string {
	for _, f := range strings.Fields(raw) {
		if strings.Contains(f, "=") && !strings.HasPrefix(f, "=") {
			continue
		}
		return f
	}
	return ""
}

// sizeChanges adapts the SSH window changes to the CLI's terminal sizes.
func sizeChanges(sizes <-chan ssh.Window) func(ctx context.Context) <-chan cli.TermSize {
	return func(ctx context.Context) <-chan cli.TermSize {
		ch := make(chan cli.TermSize, 1)
		go func() { // ends when ctx ends or the sizes end
			defer close(ch)
			for {
				select {
				case <-ctx.Done():
					return
				case w, ok := <-sizes:
					if !ok {
						return
					}
					select {
					case ch <- cli.TermSize{Rows: w.Height, Cols: w.Width}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
		return ch
	}
}
