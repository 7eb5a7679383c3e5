package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/berthvm/berth/session"
)

// sshServer returns the daemon extra that serves SSH on addr.
func sshServer(g Globals, addr string, log *slog.Logger) func(ctx context.Context, m *session.Manager) error {
	return func(ctx context.Context, m *session.Manager) error {
		return fmt.Errorf("--ssh %s: the SSH server is not built yet", addr)
	}
}

// SSH manages SSH access: berth ssh add-key [--role R] KEYFILE.
func SSH(ctx context.Context, g Globals, args []string) int {
	fmt.Fprintln(os.Stderr, "berth: ssh: not built yet")
	return 1
}
