package api_test

import (
	"context"
	"testing"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/api"
)

type hostLister struct {
	list session.HostList
	err  error
}

func (h hostLister) Hosts(context.Context) (session.HostList, error) { return h.list, h.err }

// GET /v1/hosts: not in a fleet without a lister; the lister's answer, or
// its error with its class, with one.
func TestHosts(t *testing.T) {
	l, err := start(t, nil).client.Hosts(t.Context())
	if err != nil || l.Fleet || l.Hosts == nil || len(l.Hosts) != 0 {
		t.Errorf("without a fleet: %+v, %v", l, err)
	}
	want := session.HostList{Fleet: true, Self: "a", Hosts: []session.HostInfo{{ID: "a", State: session.HostReady, CPUs: 2}}}
	l, err = start(t, nil, api.WithHosts(hostLister{list: want})).client.Hosts(t.Context())
	if err != nil || !l.Fleet || l.Self != "a" || len(l.Hosts) != 1 || l.Hosts[0].CPUs != 2 {
		t.Errorf("with a fleet: %+v, %v", l, err)
	}
	down := &session.Error{Class: session.ErrUnavailable, Msg: "the fleet's etcd did not answer"}
	_, err = start(t, nil, api.WithHosts(hostLister{err: down})).client.Hosts(t.Context())
	wantClass(t, "etcd down", err, session.ErrUnavailable)
}
