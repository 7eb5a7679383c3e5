package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/daemon"
	"github.com/berthvm/berth/ui/app/local"
	"github.com/berthvm/berth/ui/cli"
)

func hostQuarantineCmd() *cli.Command {
	return &cli.Command{
		Name: "quarantine", Group: hostGroup, Usage: "[--json]",
		Summary: "list this host's quarantined copies of sessions another host owns",
		Help: `When a fleet host joins or rejoins, each local session whose owner in etcd is another
host (or this one at a later epoch) is stopped and its copy moved aside, under the data
directory's quarantine/NAME-TIME/: its directory (disks, snapshot, logs), its records
(records.jsonl) and why (why.txt). Such a copy never runs again and is never merged or
removed by berth: read what you need from it and remove the directory. Reads the data
directory; no daemon is needed.`,
		Example: "berth quarantine\nberth quarantine --json",
		Setup: func(fs *flag.FlagSet) cli.RunFunc {
			asJSON := fs.Bool("json", false, "print JSON")
			return func(_ context.Context, c *cli.Call, _ []string) error {
				data := globals(c).Data
				if data == "" {
					data = local.DataDir()
				}
				list, err := daemon.ListQuarantined(data)
				if err != nil {
					return cli.Exit(cli.ExitFailed, err.Error())
				}
				out := c.Env().Stdout
				if *asJSON {
					if list == nil {
						list = []daemon.Quarantined{}
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(list)
				}
				if len(list) == 0 {
					fmt.Fprintln(out, "no quarantined copies")
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "SESSION\tAT\tSIZE\tWHY\tDIRECTORY")
				for _, q := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", q.Session, q.At.In(time.Local).Format("2006-01-02 15:04:05"),
						session.FormatBytesShort(q.Bytes), dash(q.Why), q.Dir)
				}
				return tw.Flush()
			}
		},
	}
}
