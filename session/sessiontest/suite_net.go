package sessiontest

import (
	"context"
	"testing"

	"github.com/berthvm/berth/session"
)

// suiteNet checks the network calls: policies (their default, parse
// errors, a change seen by Get and NetStatus) and forwards' refusals.
func suiteNet(t *testing.T, ctx context.Context, svc session.Service, name string) {
	t.Cleanup(func() { svc.SetNet(context.WithoutCancel(ctx), name, "none") })
	s, err := svc.Get(ctx, name)
	if err != nil || s.Net != session.DefaultNet {
		t.Errorf("a new session's net = %q, %v; want %q", s.Net, err, session.DefaultNet)
	}
	_, err = svc.Create(ctx, session.CreateOptions{Name: "conf-badnet", Net: "allow:10.0.0.0/33"})
	wantClass(t, "Create with a malformed policy", err, session.ErrInvalid)
	s, err = svc.SetNet(ctx, name, "allow:PyPI.org,*.github.com:443")
	if err != nil || s.Net != "allow:pypi.org,*.github.com:443" {
		t.Fatalf("SetNet = %q, %v; want the policy as parsed", s.Net, err)
	}
	if got, err := svc.Get(ctx, name); err != nil || got.Net != s.Net {
		t.Errorf("Get after SetNet: net %q, %v", got.Net, err)
	}
	st, err := svc.NetStatus(ctx, name)
	if err != nil || st.Policy != s.Net {
		t.Errorf("NetStatus = %+v, %v", st, err)
	}
	for _, bad := range []string{"", "allow:", "allow:*.", "allow::0", "allow:a.test:65536", "closed"} {
		_, err := svc.SetNet(ctx, name, bad)
		wantClass(t, "SetNet "+bad, err, session.ErrInvalid)
	}
	_, err = svc.SetNet(ctx, "conf-missing", "open")
	wantClass(t, "SetNet missing", err, session.ErrNotFound)
	_, err = svc.NetStatus(ctx, "conf-missing")
	wantClass(t, "NetStatus missing", err, session.ErrNotFound)
	_, err = svc.Forward(ctx, name, 0)
	wantClass(t, "Forward port 0", err, session.ErrInvalid)
	_, err = svc.Forward(ctx, name, 1)
	wantClass(t, "Forward to a port nobody listens on", err, session.ErrUnavailable)
	_, err = svc.Forward(ctx, "conf-missing", 80)
	wantClass(t, "Forward missing", err, session.ErrNotFound)
}
