package ui

import (
	"context"
	"fmt"
	"strings"
	"sync"

	tea "charm.land/bubbletea/v2"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/ui/common"
	"github.com/berthvm/berth/ui/components/dialog"
	"github.com/berthvm/berth/ui/portfwd"
)

// tuiForwards are the port forwards this TUI started; they live as long
// as the program (its context) and are shown in the Info tab.
type tuiForwards struct {
	mu  sync.Mutex
	per map[string][]*portfwd.Listener
}

func (f *tuiForwards) add(name string, ls []*portfwd.Listener) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.per == nil {
		f.per = map[string][]*portfwd.Listener{}
	}
	f.per[name] = append(f.per[name], ls...)
}

// list describes name's forwards: "127.0.0.1:41234→8080 (1 open)".
func (f *tuiForwards) list(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.per[name] {
		out = append(out, fmt.Sprintf("%s→%d (%d open)", l.Addr, l.Remote, l.Active()))
	}
	return out
}

// netAction is :net NAME [POLICY]: without a policy it shows the network,
// with one it changes it.
func (m *Model) netAction(c call) tea.Cmd {
	svc, name, policy := m.c.Svc, c.s.Name, strings.TrimSpace(c.tail)
	if !c.line {
		return m.netDialog(c.s)
	}
	if policy == "" {
		return m.runOp("network of "+name, func(ctx context.Context) (string, tea.Msg, error) {
			st, err := svc.NetStatus(ctx, name)
			if err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("%s: network %s · %d listening · %d refused", name, st.Policy, len(st.Listening), st.Refused), nil, nil
		})
	}
	return m.setNet(name, policy)
}

func (m *Model) setNet(name, policy string) tea.Cmd {
	svc := m.c.Svc
	return m.runOp("network of "+name, func(ctx context.Context) (string, tea.Msg, error) {
		s, err := svc.SetNet(ctx, name, policy)
		if err != nil {
			return "", nil, err
		}
		return name + ": network " + s.Net, nil, nil
	})
}

func (m *Model) netDialog(s session.Session) tea.Cmd {
	name := s.Name
	d, cmd := dialog.NewForm(m.c, "Network of "+name, "now: "+s.Net, []dialog.Field{
		{Label: "policy", Placeholder: "allow:pypi.org,files.pythonhosted.org", Hint: "none · open · allow:DOMAIN|IP|CIDR|host.berth.internal[:PORT],…"},
	}, func(v []string) (tea.Cmd, error) {
		p := strings.TrimSpace(v[0])
		if _, err := session.ParsePolicy(p); err != nil {
			return nil, err
		}
		return m.setNet(name, p), nil
	})
	return m.openDialog(d, cmd)
}

// forwardAction is :forward NAME [LOCAL:]REMOTE, or the F key's dialog.
func (m *Model) forwardAction(c call) tea.Cmd {
	if !c.line {
		return m.forwardDialog(c.s.Name)
	}
	if strings.TrimSpace(c.tail) == "" {
		return m.usage(c)
	}
	return m.startForward(c.s.Name, strings.TrimSpace(c.tail))
}

func (m *Model) forwardDialog(name string) tea.Cmd {
	d, cmd := dialog.NewForm(m.c, "Forward a port into "+name, "", []dialog.Field{
		{Label: "port", Placeholder: "8080 or 9000:8080", Hint: "[LOCAL:]REMOTE: 127.0.0.1:LOCAL here → 127.0.0.1:REMOTE in the VM"},
	}, func(v []string) (tea.Cmd, error) {
		if _, err := portfwd.ParseSpec(strings.TrimSpace(v[0])); err != nil {
			return nil, err
		}
		return m.startForward(name, strings.TrimSpace(v[0])), nil
	})
	return m.openDialog(d, cmd)
}

func (m *Model) startForward(name, arg string) tea.Cmd {
	sp, err := portfwd.ParseSpec(arg)
	if err != nil {
		return m.setFlash(common.FlashError, common.ErrorText(err))
	}
	life, svc, fw := m.c.Ctx, m.c.Svc, m.forwards
	return m.runOp("forward to "+name, func(ctx context.Context) (string, tea.Msg, error) {
		ls, err := portfwd.Listen([]portfwd.Spec{sp})
		if err != nil {
			return "", nil, err
		}
		fw.add(name, ls)
		go portfwd.Serve(life, svc, name, ls, nil) // ends with the program
		return fmt.Sprintf("forwarding %s → %s:%d (shown in Info)", ls[0].Addr, name, sp.Remote), nil, nil
	})
}
