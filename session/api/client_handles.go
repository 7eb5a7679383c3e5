package api

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/berthvm/berth/session"
)

// The socket API carries no file handles: the SSH server's SFTP, in the
// daemon, serves them. The client says so for each.

func errNoHandles(op string) error {
	return &session.Error{Class: session.ErrUnsupported, Msg: fmt.Sprintf("%s: the daemon's socket carries no file handles", op),
		Hint: "use the SSH server's SFTP, or the whole-file calls"}
}

func (c *Client) Open(ctx context.Context, name, path string, flags int, perm fs.FileMode) (session.File, error) {
	return nil, errNoHandles("open")
}

func (c *Client) Setstat(ctx context.Context, name, path string, a session.Attrs) error {
	return errNoHandles("setstat")
}

func (c *Client) StatFollow(ctx context.Context, name, path string) (session.FileInfo, error) {
	return session.FileInfo{}, errNoHandles("stat")
}

func (c *Client) Symlink(ctx context.Context, name, target, path string) error {
	return errNoHandles("symlink")
}

func (c *Client) Link(ctx context.Context, name, oldpath, newpath string) error {
	return errNoHandles("link")
}

func (c *Client) Statfs(ctx context.Context, name, path string) (session.FSStat, error) {
	return session.FSStat{}, errNoHandles("statfs")
}

func (c *Client) Rmdir(ctx context.Context, name, path string) error {
	return errNoHandles("rmdir")
}
