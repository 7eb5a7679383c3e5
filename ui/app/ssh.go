package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/sshd"
)

// sshDir is where the SSH server keeps its host key and authorized_keys.
func sshDir(g Globals) string { return filepath.Join(g.Data, "ssh") }

// sshServer returns the daemon extra that serves SSH on addr with the
// in-process Manager; it runs until ctx ends, then shuts the server down.
func sshServer(g Globals, addr string, log *slog.Logger) func(ctx context.Context, svc session.Service) error {
	return func(ctx context.Context, svc session.Service) error {
		srv, err := sshd.New(svc, sshd.Options{
			Dir:          sshDir(g),
			Logger:       log,
			Out:          os.Stderr,
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

const sshUsage = `Usage: berth ssh add-key [--role viewer|operator|admin] KEYFILE

Authorizes a public key (KEYFILE: an OpenSSH .pub file, or - for stdin) to
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

Then: ssh -t -p PORT HOST (the TUI), ssh -p PORT HOST help (commands),
sftp -P PORT SESSION@HOST (a session's /workspace).
`

// SSH manages SSH access: berth ssh add-key [--role R] KEYFILE.
func SSH(ctx context.Context, g Globals, args []string) int {
	return sshCmd(g, args, os.Stdin, os.Stdout, os.Stderr)
}

func sshCmd(g Globals, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, sshUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] != "add-key" {
		fmt.Fprintf(stderr, "berth: ssh: unknown subcommand %q (usage: berth ssh add-key [--role viewer|operator|admin] KEYFILE)\n", args[0])
		return 2
	}
	fs := newFlagSet("ssh add-key", sshUsage)
	fs.SetOutput(stderr)
	role := fs.String("role", "viewer", "what the key may do: `viewer`, operator or admin")
	// Flags may come before or after KEYFILE.
	var pos []string
	rest := args[1:]
	for {
		if code, ok := parse(fs, rest); !ok {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "berth: ssh add-key takes one KEYFILE (a .pub file, or - for stdin)")
		return 2
	}
	r, err := sshd.ParseRole(*role)
	if err != nil {
		fmt.Fprintf(stderr, "berth: ssh add-key: --role %s: use viewer, operator or admin\n", *role)
		return 2
	}
	data, err := readKeyFile(pos[0], stdin)
	if err != nil {
		fmt.Fprintln(stderr, "berth: ssh add-key:", err)
		return 1
	}
	ak, err := sshd.AddKey(sshDir(g), data, r)
	switch {
	case errors.Is(err, session.ErrExists):
		fmt.Fprintln(stderr, "berth: ssh add-key:", err)
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "berth: ssh add-key: %s: %v\n", pos[0], err)
		return 1
	}
	fmt.Fprintf(stdout, "added %s (%s) as %s to %s; it can log in now\n",
		ak.Fingerprint, ak.Name(), ak.Role, filepath.Join(sshDir(g), sshd.AuthorizedKeysFile))
	return 0
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
