package api

import (
	"context"
	"net/http"

	"github.com/berthvm/berth/session"
)

// Checkpoint saves the session's disks (and with opts.Memory its memory).
func (c *Client) Checkpoint(ctx context.Context, name string, opts session.CheckpointOptions) (session.Checkpoint, error) {
	var out session.Checkpoint
	p, err := sessionPath(name, "/checkpoints")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, opts, &out)
}

// Checkpoints lists the session's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, name string) ([]session.Checkpoint, error) {
	var out []session.Checkpoint
	p, err := sessionPath(name, "/checkpoints")
	if err != nil {
		return nil, err
	}
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}

// DeleteCheckpoint removes one checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, name, id string) error {
	i, err := seg("checkpoint id", id)
	if err != nil {
		return err
	}
	p, err := sessionPath(name, "/checkpoints/"+i)
	if err != nil {
		return err
	}
	return c.call(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Restore puts the session back on a checkpoint.
func (c *Client) Restore(ctx context.Context, name, id string) (session.RestoreResult, error) {
	var out session.RestoreResult
	p, err := sessionPath(name, "/restore")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, restoreRequest{ID: id}, &out)
}

// Fork makes newName a copy of the running or sleeping session.
func (c *Client) Fork(ctx context.Context, name, newName string) (session.ForkResult, error) {
	var out session.ForkResult
	p, err := sessionPath(name, "/fork")
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, http.MethodPost, p, nil, forkRequest{Name: newName}, &out)
}
