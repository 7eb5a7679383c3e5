package api

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/berthvm/berth/session"
)

// SocketPath is where the daemon of the data directory dataDir serves the
// API.
func SocketPath(dataDir string) string { return filepath.Join(dataDir, "berth.sock") }

// Listen opens the daemon's unix socket at socketPath, readable and
// writable by the owner only. A socket left behind by a daemon that is gone
// is replaced; one a live daemon answers on is an ErrConflict.
func Listen(socketPath string) (net.Listener, error) {
	if fi, err := os.Lstat(socketPath); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listen on %s: the path exists and is not a socket: %w", socketPath, session.ErrConflict)
		}
		if c, err := net.DialTimeout("unix", socketPath, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen on %s: another berth daemon is serving it: %w", socketPath, session.ErrConflict)
		}
		if err := os.Remove(socketPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing stale socket %s: %w", socketPath, err)
		}
	}
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	if err := os.Chmod(socketPath, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting %s to its owner: %w", socketPath, err)
	}
	return ln, nil
}
