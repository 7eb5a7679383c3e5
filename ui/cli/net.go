package cli

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"

	"github.com/berthvm/berth/session"
)

// netHelp explains policies; create --net and net share it.
const netHelp = "A policy is none (no egress: the default), open (any public address), or\n" +
	"allow:ENTRY[,ENTRY…] (only what the entries name). An entry is a domain (pypi.org,\n" +
	"*.githubusercontent.com), an IP address or CIDR ([…] around IPv6 with a port), or\n" +
	"host.berth.internal (this host), each with an optional :PORT. open:ENTRY,… adds entries to open.\n" +
	"Loopback, private, link-local, CGNAT and metadata addresses are refused under every policy\n" +
	"unless an entry names them, whatever a name resolves to; the daemon resolves names itself.\n" +
	"The guest reaches the network through berth's proxy (http_proxy/https_proxy are set for\n" +
	"commands and shells); a refused connection answers HTTP 403 with the reason. Tools that\n" +
	"ignore the proxy variables fail at once: the VM has no network interface but loopback."

func netCmd() *Command {
	return &Command{
		Name: "net", Action: session.ActionNet, Group: "Sessions", Usage: "NAME [POLICY] [--json]", Args: []string{"NAME", "[POLICY]"},
		Summary: "show or change a session's network policy",
		Help: "Without POLICY, shows the session's policy, the ports its VM listens on, its\n" +
			"forwarded connections and egress counts. With POLICY, changes the policy; a running\n" +
			"session applies it to new connections at once, and sleep, stop, start and replace keep it.\n\n" + netHelp,
		Example: "berth net demo allow:pypi.org,files.pythonhosted.org,*.github.com:443\nberth net demo none",
		Setup: func(fs *flag.FlagSet) RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if len(args) == 2 {
					s, err := svc.SetNet(ctx, args[0], args[1])
					if err != nil {
						return err
					}
					if *asJSON {
						return writeJSON(c.env.Stdout, s)
					}
					fmt.Fprintf(c.env.Stdout, "%s: network %s\n", s.Name, s.Net)
					return nil
				}
				st, err := svc.NetStatus(ctx, args[0])
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(c.env.Stdout, st)
				}
				t := newTable(c.env.Stdout, "Policy:", st.Policy)
				t.row("Listening:", listeningText(st))
				t.row("Forwarded:", forwardedText(st))
				t.row("Egress:", fmt.Sprintf("%d open, %d made, %d refused", st.Open, st.Accepted, st.Refused))
				t.flush()
				return nil
			}
		},
	}
}

func listeningText(st session.NetStatus) string {
	if len(st.Listening) == 0 {
		return "none (or the session is not running)"
	}
	var parts []string
	for _, p := range st.Listening {
		parts = append(parts, fmt.Sprintf("%d (%s)", p.Port, p.Addr))
	}
	return strings.Join(parts, ", ")
}

func forwardedText(st session.NetStatus) string {
	if len(st.Forwarded) == 0 {
		return "none"
	}
	ports := make([]int, 0, len(st.Forwarded))
	for p := range st.Forwarded {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	var parts []string
	for _, p := range ports {
		parts = append(parts, fmt.Sprintf("%d (%s)", p, plural(st.Forwarded[p], "connection")))
	}
	return strings.Join(parts, ", ")
}
