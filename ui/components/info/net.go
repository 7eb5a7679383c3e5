package info

import (
	"fmt"
	"sort"
	"strings"

	"github.com/berthvm/berth/ui/common"
)

// SetForwards gives the tab the program's own port forwards to show, per
// session (the TUI's :forward).
func (m *Model) SetForwards(f func(name string) []string) { m.forwards = f }

// netText is the network line: the policy, the ports the guest listens on
// (as of the last load: r reloads) and the forwards.
func (m *Model) netText() string {
	policy := m.sess.Net
	if policy == "" {
		policy = "none"
	}
	parts := []string{common.SanitizeLine(policy)}
	if st := m.net; st != nil {
		if len(st.Listening) > 0 {
			var ls []string
			for _, p := range st.Listening {
				ls = append(ls, fmt.Sprintf("%d", p.Port))
			}
			parts = append(parts, "listening "+strings.Join(ls, ","))
		}
		if len(st.Forwarded) > 0 {
			var fs []string
			for p, n := range st.Forwarded {
				fs = append(fs, fmt.Sprintf("%d×%d", p, n))
			}
			sort.Strings(fs)
			parts = append(parts, "forwarded conns "+strings.Join(fs, ","))
		}
		if st.Refused > 0 {
			parts = append(parts, fmt.Sprintf("%d refused", st.Refused))
		}
	}
	if m.forwards != nil {
		if f := m.forwards(m.sess.Name); len(f) > 0 {
			parts = append(parts, "forwards "+strings.Join(f, ", "))
		}
	}
	return strings.Join(parts, " · ")
}
