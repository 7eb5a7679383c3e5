package api

import (
	"context"
	"net/http"

	"github.com/berthvm/berth/session"
)

func (s *server) hosts(w http.ResponseWriter, r *http.Request) {
	if s.hostList == nil {
		s.writeJSON(w, http.StatusOK, session.HostList{Hosts: []session.HostInfo{}})
		return
	}
	list, err := s.hostList.Hosts(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, list)
}

// Hosts lists the hosts of the daemon's fleet (Fleet false: it is in
// none).
func (c *Client) Hosts(ctx context.Context) (session.HostList, error) {
	var out session.HostList
	return out, c.call(ctx, http.MethodGet, "/v1/hosts", nil, nil, &out)
}

var _ session.HostLister = (*Client)(nil)
