package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/fleet/memberconf"
	"github.com/berthvm/berth/session/fleet/pki"
	"github.com/berthvm/berth/ui/app/local"
	"github.com/berthvm/berth/ui/cli"
)

func hostLsCmd() *cli.Command {
	return &cli.Command{
		Name: "host ls", Action: session.ActionHosts, Group: hostGroup, Usage: "[--json]",
		Summary: "list the hosts of this berth's fleet: state, capacity, what is promised",
		Help: `Asks this host's daemon, which reads the fleet's etcd. STATE is ready, draining (placement
puts nothing new there), gone (its lease expired, or it left in a clean stop: NOTE says
which) or, for this host, isolated (it cannot confirm its lease: it refuses changes, its
VMs run on). CPUS and MEMORY are promised/has. A berth started without --fleet says it is
not in a fleet.`,
		Example: "berth host ls\nberth host ls --json | jq -r '.hosts[] | select(.state==\"ready\") | .id'",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(ctx context.Context, c *cli.Call, _ []string) error {
				cl, err := local.Connect(ctx, globals(c), "cli", false)
				if err != nil {
					return err
				}
				defer cl.Close()
				list, err := cl.Hosts(ctx)
				if err != nil {
					return err
				}
				out := c.Env().Stdout
				if *asJSON {
					if list.Hosts == nil {
						list.Hosts = []session.HostInfo{}
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(list)
				}
				if !list.Fleet {
					fmt.Fprintln(out, "this berth is not in a fleet (berth serve --fleet ETCD_URLS --host-id H joins one)")
					return nil
				}
				return writeHosts(out, list, time.Local)
			}
		},
	}
}

func hostDrainCmd() *cli.Command {
	return &cli.Command{
		Name: "host drain", Action: session.ActionDrain, Group: hostGroup, Usage: "HOST [--json]", Args: []string{"HOST"},
		Summary: "stop placing sessions on a fleet host and move its stopped and sleeping ones off",
		Help: `Marks HOST draining: placement puts no new session there, and create --on HOST is refused,
until berth host undrain HOST; the mark is kept in HOST's own registration and lasts across its
restarts. Then each session HOST holds is taken in turn: a stopped or sleeping one moves (as
berth move does) to a host placement picks: live, not draining, with room, one that has the
session's image first. A running, paused or crashed one is left where it is, with what to do:
berth sleep NAME (a sleeping session wakes on its new host with its processes) or berth stop
NAME, then berth host drain HOST again. One line per session says what became of it. The exit
status is 1 when any session is still on HOST. Any host's berth can drain any host: the call
goes to HOST, which marks itself and sends its sessions; a host that is gone or isolated from
the fleet is refused.`,
		Example: "berth host drain h2\nberth --host tcp://h1:7443 host drain h2",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			asJSON := fs.Bool("json", false, "print the result as JSON, not a line per session")
			return func(ctx context.Context, c *cli.Call, args []string) error {
				cl, err := local.Connect(ctx, globals(c), "cli", false)
				if err != nil {
					return err
				}
				defer cl.Close()
				out := c.Env().Stdout
				var progress func(session.DrainStep)
				if !*asJSON {
					progress = func(s session.DrainStep) { fmt.Fprintln(out, drainLine(args[0], s)) }
				}
				res, err := cl.Drain(ctx, args[0], progress)
				if err != nil {
					return err
				}
				if *asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					if err := enc.Encode(res); err != nil {
						return err
					}
				}
				if err := drainSummary(res); err != nil {
					return err
				}
				if !*asJSON {
					fmt.Fprintf(out, "host %s is draining: %s\n", res.Host, moved(len(res.Steps)))
				}
				return nil
			}
		},
	}
}

// drainLine is one session of a drain of host, for people.
func drainLine(host string, s session.DrainStep) string {
	switch s.Outcome {
	case session.DrainMoved:
		took := s.Took.Round(100 * time.Millisecond)
		if s.Took < time.Second {
			took = s.Took.Round(time.Millisecond)
		}
		return fmt.Sprintf("moved %s to %s in %s (%s there)", s.Session, s.To, took, s.State)
	case session.DrainLeft:
		return fmt.Sprintf("left %s on %s: %s", s.Session, host, s.Why)
	}
	return fmt.Sprintf("failed to move %s: %s", s.Session, s.Why)
}

// drainSummary is the drain's last word: nil when every session moved,
// else the exit with one line saying how many are still there.
func drainSummary(res session.DrainResult) error {
	if res.Moved() {
		return nil
	}
	left := 0
	for _, s := range res.Steps {
		if s.Outcome != session.DrainMoved {
			left++
		}
	}
	return cli.Exit(cli.ExitFailed, fmt.Sprintf("host %s is draining, but %d of its %d sessions are still there (see above)", res.Host, left, len(res.Steps)))
}

// moved says how many sessions a drain that left none moved.
func moved(n int) string {
	switch n {
	case 0:
		return "it holds no sessions"
	case 1:
		return "its one session moved"
	}
	return fmt.Sprintf("its %d sessions moved", n)
}

func hostUndrainCmd() *cli.Command {
	return &cli.Command{
		Name: "host undrain", Action: session.ActionDrain, Group: hostGroup, Usage: "HOST", Args: []string{"HOST"},
		Summary: "let placement put sessions on a drained fleet host again",
		Help: `Ends berth host drain HOST: placement may put new sessions on HOST again, and create --on
HOST is accepted. Sessions moved off it stay where they went (berth move NAME --to HOST brings
one back). As a drain, it goes to HOST itself, which must be up and not isolated.`,
		Example: "berth host undrain h2",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			return func(ctx context.Context, c *cli.Call, args []string) error {
				cl, err := local.Connect(ctx, globals(c), "cli", false)
				if err != nil {
					return err
				}
				defer cl.Close()
				if err := cl.Undrain(ctx, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(c.Env().Stdout, "host %s takes new sessions again\n", args[0])
				return nil
			}
		},
	}
}

// writeHosts prints host ls's table.
func writeHosts(w io.Writer, list session.HostList, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tADDRESS\tCPUS\tMEMORY\tDISK FREE\tSESSIONS\tIMAGES\tSINCE\tNOTE")
	for _, h := range list.Hosts {
		id := h.ID
		if id == list.Self {
			id += " (this)"
		}
		note := ""
		switch h.State {
		case session.HostGone:
			note = "lease expired"
			if h.Left {
				note = "left"
			}
		case session.HostIsolated:
			note = "lease not confirmed: changes refused"
		}
		images := strings.Join(h.Images, ",")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s/%s\t%s\t%d\t%s\t%s\t%s\n", id, h.State, dash(h.Addr),
			h.Used.CPUs, h.CPUs, session.FormatBytesShort(h.Used.MemoryMiB<<20), session.FormatBytesShort(h.MemoryMiB<<20),
			session.FormatBytesShort(h.DiskFree), h.Used.Sessions, dash(images), h.Since.In(loc).Format("2006-01-02 15:04:05"), dash(note))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func etcdCmd() *cli.Command {
	return &cli.Command{
		Name: "etcd", Group: hostGroup, Usage: "--name N --data DIR [--listen-client URL] [--listen-peer URL] [--initial-cluster N=URL,…] [--fleet-ca DIR] [-v]",
		Summary: "run an embedded etcd member for a fleet, in the foreground",
		Help: `Runs one etcd member (etcd v3.7.3, from berth-etcd next to berth) for people who have no etcd yet;
berth serve --fleet joins a fleet on its client URLs. Alone it is a cluster of one; for
three, start each with the same --initial-cluster naming all three. SIGINT or SIGTERM
stops it. The data directory remembers which member and cluster it belongs to, and
another is refused. Without --fleet-ca, URLs are http://IP:PORT on loopback only;
with it, https://IP:PORT anywhere, and every client and peer must present a
certificate of the fleet's CA (the member's own is issued into DIR/tls).`,
		Example: "berth etcd --name e1 --data /var/lib/berth-etcd",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			var c memberconf.Config
			c.Bind(fs)
			return func(ctx context.Context, call *cli.Call, _ []string) error {
				if err := c.Check(); err != nil {
					return cli.UsageErrorf("%v", err)
				}
				return execEtcd(c)
			}
		},
	}
}

// execEtcd becomes berth-etcd, found next to berth as berth-agent is:
// etcd's server is linked there, not here (see its package doc), and
// the member then gets berth's signals itself.
func execEtcd(c memberconf.Config) error {
	exe, err := os.Executable()
	if err != nil {
		return cli.Exit(cli.ExitFailed, fmt.Sprintf("find berth-etcd: %v", err))
	}
	path := filepath.Join(filepath.Dir(exe), "berth-etcd")
	if _, err := os.Stat(path); err != nil {
		return cli.Exit(cli.ExitFailed, fmt.Sprintf("berth-etcd is not next to berth (%s): build it with make build, or install it with make install", path))
	}
	err = syscall.Exec(path, append([]string{"berth-etcd"}, c.Args()...), os.Environ())
	return cli.Exit(cli.ExitFailed, fmt.Sprintf("run %s: %v", path, err))
}

func fleetInitCmd() *cli.Command {
	return &cli.Command{
		Name: "fleet init", Group: hostGroup, Usage: "--dir DIR [--name NAME]",
		Summary: "make a fleet's certificate authority, for mutual TLS between hosts and etcd",
		Help: `Makes DIR/ca.crt and DIR/ca.key (ECDSA P-256, ten years; the key 0600). berth etcd
--fleet-ca DIR and berth serve --fleet-ca DIR issue their own certificates from it on first
start (two years, server and client use) and from then on accept only peers with a
certificate of this CA. A directory that holds a CA already is refused. Keep ca.key
where only the fleet's operators can read it.`,
		Example: "berth fleet init --dir /etc/berth/fleet-ca",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			dir := fs.String("dir", "", "make the CA in `DIR`")
			name := fs.String("name", "fleet", "the CA's `NAME`, in its subject")
			return func(_ context.Context, c *cli.Call, _ []string) error {
				if *dir == "" {
					return cli.UsageErrorf("--dir is needed")
				}
				if err := pki.Init(*dir, *name); err != nil {
					return cli.Exit(cli.ExitFailed, err.Error())
				}
				fmt.Fprintf(c.Env().Stdout, "made the fleet CA in %s (%s, %s)\n", *dir, pki.CACert, pki.CAKey)
				return nil
			}
		},
	}
}

func fleetCertCmd() *cli.Command {
	return &cli.Command{
		Name: "fleet cert", Group: hostGroup, Usage: "--dir CA --name NAME --out DIR [--dns NAME,…] [--ip IP,…]",
		Summary: "issue a certificate of the fleet's CA: an operator's, to reach hosts with --host",
		Help: `Issues a certificate and key for NAME, signed by the CA in --dir (berth fleet init), into
--out, with the CA's certificate beside them: out alone is then enough. It is good as client
and server, so the same command makes a host's certificate for a host that has only ca.crt
(its berth serve --fleet-ca then names a directory holding ca.crt, and its data directory's
fleet-tls/ this certificate). An operator gives the directory to berth --cert-dir DIR (or
BERTH_CERT_DIR) with --host tcp://HOST:PORT (or BERTH_HOST), and every command reaches the
sessions of the whole fleet through that host.`,
		Example: "berth fleet cert --dir /etc/berth/fleet-ca --name alice --out ~/.config/berth/alice\nberth --host tcp://h1:7443 --cert-dir ~/.config/berth/alice ls",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			dir := fs.String("dir", "", "the fleet CA's `DIR` (with ca.key)")
			name := fs.String("name", "", "the certificate's `NAME`: an operator's or a host id")
			out := fs.String("out", "", "write tls.crt, tls.key and ca.crt into `DIR`")
			dnsList := fs.String("dns", "", "more DNS `NAMES` it is good for, comma-separated (a host's)")
			ipList := fs.String("ip", "", "more `IPS` it is good for, comma-separated (a host's)")
			return func(_ context.Context, c *cli.Call, _ []string) error {
				if *dir == "" || *name == "" || *out == "" {
					return cli.UsageErrorf("--dir, --name and --out are needed")
				}
				var dns []string
				var ips []net.IP
				for _, d := range strings.Split(*dnsList, ",") {
					if d = strings.TrimSpace(d); d != "" {
						dns = append(dns, d)
					}
				}
				for _, s := range strings.Split(*ipList, ",") {
					if s = strings.TrimSpace(s); s == "" {
						continue
					}
					ip := net.ParseIP(s)
					if ip == nil {
						return cli.UsageErrorf("--ip %q is not an IP address", s)
					}
					ips = append(ips, ip)
				}
				if err := pki.Issue(*dir, *out, *name, dns, ips); err != nil {
					return cli.Exit(cli.ExitFailed, err.Error())
				}
				fmt.Fprintf(c.Env().Stdout, "issued %s's certificate into %s (%s, %s, %s)\n", *name, *out, pki.Cert, pki.Key, pki.CACert)
				return nil
			}
		},
	}
}
