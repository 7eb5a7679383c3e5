package sshd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/gliderlabs/ssh"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/ui/mcpserver"
)

// handleSession serves one session channel: the TUI when the client asked
// for a shell (or "tui"), a CLI command otherwise.
func (s *Server) handleSession(sess ssh.Session) {
	// Drain window changes first, whatever happens next: an undrained
	// channel blocks the connection's request loop.
	pty, winCh, isPty := sess.Pty()
	var sizes <-chan ssh.Window
	if isPty {
		sizes = feedSizes(winCh)
	}
	if !s.begin() {
		fmt.Fprintln(sess.Stderr(), "berth: the server is shutting down; try again shortly")
		sess.Exit(1)
		return
	}
	defer s.handlers.Done()
	ak, c, err := s.identify(sess)
	if err != nil {
		fmt.Fprintf(sess.Stderr(), "berth: %s\n", oneLine(err))
		sess.Exit(1)
		return
	}
	var stderr io.Writer = sess.Stderr()
	if isPty {
		stderr = crlfWriter{stderr} // the client's terminal is raw
	}
	sn, ok, err := s.sessionFor(sess.Context(), sess.User())
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "berth: cannot look up session %q: %s\n", sess.User(), oneLine(err))
		sess.Exit(cli.ExitFailed)
		return
	case !ok && sess.User() != workbenchUser && strings.TrimSpace(sess.RawCommand()) != "":
		s.log.Info("ssh: command for no session refused", "remote", sess.RemoteAddr().String(), "key", ak.Fingerprint, "user", sess.User())
		fmt.Fprintln(stderr, "berth: "+noSession(sess.User(), sess.LocalAddr()))
		sess.Exit(cli.ExitUsage)
		return
	}
	if ok {
		// NAME@HOST: the session is the host.
		c.busy.Add(1)
		defer func() {
			c.lastRead.Store(time.Now().UnixNano())
			c.busy.Add(-1)
		}()
		log := s.log.With("remote", sess.RemoteAddr().String(), "key", ak.Fingerprint, "name", ak.Name(), "role", ak.Role.String(), "session", sn.Name)
		start := time.Now()
		log.Info("ssh: in session", "shell", strings.TrimSpace(sess.RawCommand()) == "", "pty", isPty)
		code := s.runInSession(sess, ak, sn, pty, sizes, isPty)
		log.Info("ssh: session ended", "exit", code, "took", time.Since(start).Round(time.Millisecond))
		sess.Exit(code)
		return
	}
	args := sess.Command()
	if len(args) == 0 && strings.TrimSpace(sess.RawCommand()) != "" {
		fmt.Fprintf(sess.Stderr(), "berth: cannot split the command line %q into words (unbalanced quotes?)\n", sess.RawCommand())
		sess.Exit(cli.ExitUsage)
		return
	}
	if len(args) > 0 && args[0] == "berth" {
		args = args[1:] // "ssh berth@HOST berth ls" works too
	}
	log := s.log.With("remote", sess.RemoteAddr().String(), "key", ak.Fingerprint, "name", ak.Name(), "role", ak.Role.String())
	start := time.Now()
	var code int
	if len(args) == 0 || (len(args) == 1 && args[0] == "tui") {
		log.Info("ssh: TUI", "pty", isPty)
		code = s.runTUI(sess, ak, pty, sizes, isPty)
	} else {
		// No idle timeout while a command runs, and until its exit status
		// is out; idleness counts from its end.
		c.busy.Add(1)
		defer func() {
			c.lastRead.Store(time.Now().UnixNano())
			c.busy.Add(-1)
		}()
		// Arguments can hold secrets (exec --env): log the command only.
		log.Info("ssh: command", "command", args[0], "pty", isPty)
		code = s.runCommand(sess, ak, args, pty, sizes, isPty)
	}
	log.Info("ssh: session ended", "exit", code, "took", time.Since(start).Round(time.Millisecond))
	sess.Exit(code)
}

// feedSizes drains a session's window-change channel, which gliderlabs
// fills from the connection's request loop and closes when the channel's
// requests end: an undrained one blocks that loop. The returned channel
// holds the latest size and is closed after winCh; its goroutine ends then.
func feedSizes(winCh <-chan ssh.Window) <-chan ssh.Window {
	out := make(chan ssh.Window, 1)
	go func() {
		defer close(out)
		for w := range winCh {
			select { // keep only the latest size
			case <-out:
			default:
			}
			out <- w // never blocks: this is the only sender
		}
	}()
	return out
}

// runCommand runs one CLI command with the session's streams and returns
// its exit code. The table is cli's built-in commands alone: those of the
// daemon's host (serve, doctor...) are unknown here.
func (s *Server) runCommand(sess ssh.Session, ak AuthorizedKey, args []string, pty ssh.Pty, sizes <-chan ssh.Window, isPty bool) int {
	var stderr io.Writer = sess.Stderr()
	if isPty {
		stderr = crlfWriter{stderr} // the client's terminal is raw
	}
	svc := s.serviceFor(ak)
	var stdin io.Reader = sess
	if isPty && args[0] == "delete" {
		// delete prompts for a line; everything else that reads a
		// terminal (shell, exec -t) wants it raw.
		stdin = &lineReader{r: sess, echo: sess}
	}
	env := cli.Env{
		Stdin:        stdin,
		Stdout:       sess,
		Stderr:       stderr,
		Connect:      func(context.Context) (session.Service, error) { return svc, nil },
		StdinTTY:     isPty,
		StdoutTTY:    isPty,
		StderrTTY:    isPty,
		Who:          ak.Actor(),
		NoLocalFiles: true,
		MCP:          mcpserver.Stdio,
	}
	if isPty {
		env.Size = cli.TermSize{Rows: pty.Window.Height, Cols: pty.Window.Width}
		env.Term = pty.Term
		env.SizeChanges = sizeChanges(sizes)
	}
	return cli.Run(sess.Context(), env, args)
}

// runTUI runs the terminal UI, one program per session, until the
// operator quits, the client goes away or the server shuts down.
func (s *Server) runTUI(sess ssh.Session, ak AuthorizedKey, pty ssh.Pty, sizes <-chan ssh.Window, isPty bool) int {
	if !isPty {
		fmt.Fprintln(sess.Stderr(), "berth: the TUI needs a terminal: ssh -t ... (commands work without one: ssh berth@HOST help)")
		return cli.ExitUsage
	}
	ctx, cancel := context.WithCancel(sess.Context())
	defer cancel()
	env := append(sess.Environ(), "TERM="+pty.Term)
	g := s.guardFor(ak)
	m := ui.New(g, ui.Options{
		ReadOnly:     ak.Role == Viewer,
		Permit:       g.permit,
		Who:          ak.Actor() + " (" + ak.Role.String() + ")",
		DaemonStatus: s.opts.DaemonStatus,
		Logger:       s.log,
		Context:      ctx,
	})
	p := tea.NewProgram(m,
		tea.WithContext(ctx),
		tea.WithInput(sess),
		tea.WithOutput(sess),
		tea.WithEnvironment(env),
		tea.WithColorProfile(colorprofile.Env(env)),
		tea.WithWindowSize(pty.Window.Width, pty.Window.Height),
		tea.WithoutSignalHandler(),
		tea.WithFilter(func(_ tea.Model, msg tea.Msg) tea.Msg {
			if _, ok := msg.(tea.SuspendMsg); ok { // ctrl+z must not stop the daemon
				return tea.ResumeMsg{}
			}
			return msg
		}),
	)
	var wg sync.WaitGroup
	shuttingDown := false
	wg.Go(func() { // resizes and shutdown; ends with ctx
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.closing:
				shuttingDown = true
				p.Quit()
				return
			case w, ok := <-sizes:
				if !ok {
					sizes = nil
					continue
				}
				p.Send(tea.WindowSizeMsg{Width: w.Width, Height: w.Height})
			}
		}
	})
	_, err := p.Run()
	cancel()
	wg.Wait()
	p.Kill()
	switch {
	case shuttingDown:
		fmt.Fprintln(sess.Stderr(), "berth: the daemon is shutting down")
		return 1
	case err != nil && !errors.Is(err, tea.ErrProgramKilled):
		s.log.Error("ssh: TUI failed", "remote", sess.RemoteAddr().String(), "err", err)
		fmt.Fprintf(sess.Stderr(), "berth: the TUI failed: %s\n", oneLine(err))
		return 1
	}
	return 0
}

// lineReader edits a line for a prompt on a client terminal in raw mode:
// it echoes what is typed, handles backspace, and hands out the line only
// at Enter. Ctrl-C and Ctrl-D end input, dropping the unfinished line.
type lineReader struct {
	r    io.Reader
	echo io.Writer
	line []byte // being typed
	out  []byte // finished, not yet read
	err  error
}

func (l *lineReader) Read(p []byte) (int, error) {
	var b [1]byte
	for len(l.out) == 0 {
		if l.err != nil {
			return 0, l.err
		}
		n, err := l.r.Read(b[:])
		if n == 1 {
			switch c := b[0]; {
			case c == '\r' || c == '\n':
				l.echo.Write([]byte("\r\n"))
				l.out, l.line = append(l.line, '\n'), nil
			case c == 0x7f || c == 0x08:
				if len(l.line) > 0 {
					l.line = l.line[:len(l.line)-1]
					l.echo.Write([]byte("\b \b"))
				}
			case c == 0x03:
				l.echo.Write([]byte("^C\r\n"))
				l.line, l.err = nil, errors.New("interrupted")
			case c == 0x04:
				l.echo.Write([]byte("\r\n"))
				l.line, l.err = nil, io.EOF
			case c >= 0x20:
				l.line = append(l.line, c)
				l.echo.Write(b[:])
			}
		}
		if err != nil && l.err == nil {
			l.line, l.err = nil, err
		}
	}
	n := copy(p, l.out)
	l.out = l.out[n:]
	return n, nil
}

// crlfWriter turns \n into \r\n for a client whose terminal is in raw
// mode (gliderlabs does this for stdout, not for stderr).
type crlfWriter struct{ w io.Writer }

func (c crlfWriter) Write(b []byte) (int, error) {
	if bytes.IndexByte(b, '\n') < 0 {
		return c.w.Write(b)
	}
	out := bytes.ReplaceAll(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
	if _, err := c.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// oneLine keeps an error to its first line.
func oneLine(err error) string {
	msg := strings.TrimSpace(err.Error())
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i] + " …"
	}
	return msg
}
