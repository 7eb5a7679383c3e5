package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/cli"
	"github.com/berthvm/berth/ui/sshd"
)

// sshDir is where the SSH server keeps its host key and authorized_keys.
func sshDir(g cli.Globals) string { return filepath.Join(g.Data, "ssh") }

// sshServer returns the daemon extra that serves SSH on addr with the
// in-process Manager; it runs until ctx ends, then shuts the server down.
// out receives the lines meant for the person who started the daemon.
func sshServer(g cli.Globals, addr string, log *slog.Logger, out io.Writer) func(ctx context.Context, svc session.Service) error {
	return func(ctx context.Context, svc session.Service) error {
		srv, err := sshd.New(svc, sshd.Options{
			Dir:          sshDir(g),
			Logger:       log,
			Out:          out,
			DaemonStatus: func() string { return fmt.Sprintf("pid %d, ssh %s", os.Getpid(), addr) },
		})
		if err != nil {
			return fmt.Errorf("--ssh %s: %w", addr, err)
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("--ssh %s: %w (is another server using that port?)", addr, err)
		}
		return srv.Serve(ctx, ln)
	}
}

func sshAddKeyCmd() *cli.Command {
	return &cli.Command{
		Name: "ssh add-key", Group: hostGroup, Usage: "[--role viewer|operator|admin] KEYFILE", Args: []string{"KEYFILE"},
		Summary: "authorize a public key to log in over SSH",
		Help: `Authorizes a public key (KEYFILE: an OpenSSH .pub file, or - for stdin) to
log in to 'berth serve --ssh ADDR'. It appends one line to
<data>/ssh/authorized_keys (OpenSSH syntax, re-read at every login, so no
restart is needed):

  berth-role="operator" ssh-ed25519 AAAAC3Nza... alice@laptop

Roles, enforced by the server on every call:
  viewer    read everything (sessions, events, output, files); change nothing
  operator  also create, pause, resume, stop, start, flush, exec, shell and
            change files; no delete
  admin     everything, including delete

A line without berth-role is a viewer. The key's comment (or its SHA256
fingerprint) names it in records: "ssh:alice@laptop". Delete a line to
revoke a key: its open connections are closed within seconds.

Then: ssh -t -p PORT HOST (the TUI), ssh -p PORT berth@HOST help (commands),
sftp -P PORT SESSION@HOST (a session's /workspace).`,
		Example: "berth ssh add-key --role operator ~/.ssh/id_ed25519.pub",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			role := fs.String("role", "viewer", "what the key may do: `viewer`, operator or admin")
			return func(_ context.Context, c *cli.Call, args []string) error {
				r, err := sshd.ParseRole(*role)
				if err != nil {
					return cli.UsageErrorf("--role %s: use viewer, operator or admin", *role)
				}
				g, env := globals(c), c.Env()
				data, err := readKeyFile(args[0], env.Stdin)
				if err != nil {
					return err
				}
				ak, err := sshd.AddKey(sshDir(g), data, r)
				switch {
				case errors.Is(err, session.ErrExists):
					return err
				case err != nil:
					return fmt.Errorf("%s: %w", args[0], err)
				}
				fmt.Fprintf(env.Stdout, "added %s (%s) as %s to %s; it can log in now\n",
					ak.Fingerprint, ak.Name(), ak.Role, filepath.Join(sshDir(g), sshd.AuthorizedKeysFile))
				return nil
			}
		},
	}
}

// readKeyFile reads a public key file, or stdin for "-"; public keys are
// small, so anything past 64 KiB is not one.
func readKeyFile(name string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 64<<10+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("%s is larger than 64 KiB: not a public key", name)
	}
	return b, nil
}
