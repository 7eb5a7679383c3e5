package api

import (
	"context"
	"net/http"

	"github.com/berthvm/berth/session"
)

// History returns a session's samples of the last session.HistoryWindow.
func (c *Client) History(ctx context.Context, name string) ([]session.Sample, error) {
	p, err := sessionPath(name, "/history")
	if err != nil {
		return nil, err
	}
	var out []session.Sample
	return out, c.call(ctx, http.MethodGet, p, nil, nil, &out)
}
