package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/berthvm/berth/session"
)

// StatsRow is one session in `berth stats --json`: what the table shows,
// in plain units. Live is absent for sessions that are not running (they
// are not sampled).
type StatsRow struct {
	Name             string        `json:"name"`
	State            session.State `json:"state"`
	CPUs             int           `json:"cpus"`
	MemoryLimitBytes int64         `json:"memory_limit_bytes"`
	MemUsedBytes     int64         `json:"mem_used_bytes"`
	WorkspaceUsed    int64         `json:"workspace_used"`
	WorkspaceSize    int64         `json:"workspace_size"`
	DirtyBytes       int64         `json:"dirty_bytes"`
	Running          int           `json:"running"`
	Live             *session.Live `json:"live,omitempty"`
}

func statsRow(s session.Session) StatsRow {
	return StatsRow{
		Name: s.Name, State: s.State, CPUs: s.CPUs, MemoryLimitBytes: int64(s.MemoryMiB) << 20, MemUsedBytes: s.MemUsedBytes,
		WorkspaceUsed: s.WorkspaceUsed, WorkspaceSize: s.DiskBytes, DirtyBytes: s.DirtyBytes, Running: s.Running, Live: s.Live,
	}
}

func statsCmd() *Command {
	return &Command{
		Name: "stats", Action: session.ActionRead, Group: "Sessions", Usage: "[NAME...] [--no-stream] [--json] [--all]",
		Args:    []string{"[NAME...]"},
		Summary: "show live CPU, memory and disk figures of sessions",
		Help: "A live table like 'docker stats', refreshed as the daemon samples (every few seconds),\n" +
			"until interrupted. CPU is the VMM process's CPU on the host as a share of the session's\n" +
			"vCPUs (100% = all busy); GUEST is the guest's own view. MEM is the guest's memory in use\n" +
			"against its size; RSS the VMM's resident memory on the host. DISK R/W is the workspace\n" +
			"and system disks' traffic per second as the guest sees it. Only running sessions are\n" +
			"sampled; without names or --all, only running sessions are listed.\n" +
			"--no-stream prints one table and exits; --json prints JSON (one array per refresh, a\n" +
			"line each, when streaming).",
		Example: "berth stats\nberth stats demo --no-stream --json | jq '.[0].live.cpu_percent'",
		Setup: func(fs *flag.FlagSet) RunFunc {
			noStream := fs.Bool("no-stream", false, "print the current figures once and exit")
			asJSON := fs.Bool("json", false, "print JSON")
			all := fs.Bool("all", false, "list sessions that are not running too")
			return func(ctx context.Context, c *Call, names []string) error {
				for _, n := range names {
					if err := session.ValidateName(n); err != nil {
						return err
					}
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				pick := func(list []session.Session) []StatsRow {
					rows := []StatsRow{}
					for _, s := range list {
						if (len(names) == 0 && (*all || s.State == session.StateRunning)) || slices.Contains(names, s.Name) {
							rows = append(rows, statsRow(s))
						}
					}
					return rows
				}
				if *noStream {
					list, err := statsList(ctx, svc, names)
					if err != nil {
						return err
					}
					return writeStats(c, pick(list), *asJSON, false)
				}
				return streamStats(ctx, c, svc, names, pick, *asJSON)
			}
		},
	}
}

// statsList gets the named sessions (each must exist), or all of them.
func statsList(ctx context.Context, svc session.Service, names []string) ([]session.Session, error) {
	if len(names) == 0 {
		return svc.List(ctx)
	}
	out := make([]session.Session, 0, len(names))
	for _, n := range names {
		s, err := svc.Get(ctx, n)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// statsRefresh is how often the streaming table is redrawn at most.
const statsRefresh = time.Second

// streamStats follows the Watch stream and redraws the table when the
// figures changed, at most every statsRefresh, until ctx ends.
func streamStats(ctx context.Context, c *Call, svc session.Service, names []string, pick func([]session.Session) []StatsRow, asJSON bool) error {
	if _, err := statsList(ctx, svc, names); err != nil {
		return err // a missing name fails at once
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evs, err := svc.Watch(ctx)
	if err != nil {
		return err
	}
	sessions := map[string]session.Session{}
	t := time.NewTicker(statsRefresh)
	defer t.Stop()
	dirty, drawn := true, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-evs:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("the daemon ended the watch: %w", session.ErrUnavailable)
			}
			switch {
			case ev.Kind == session.EventDeleted:
				delete(sessions, ev.Name)
			case ev.Session != nil && (ev.Kind == session.EventState || ev.Kind == session.EventStats):
				sessions[ev.Name] = *ev.Session
			default:
				continue
			}
			dirty = true
			if !drawn {
				continue // the first table waits for the initial burst (the next tick)
			}
		case <-t.C:
			if !dirty {
				continue
			}
			list := make([]session.Session, 0, len(sessions))
			for _, s := range sessions {
				list = append(list, s)
			}
			sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
			if err := writeStats(c, pick(list), asJSON, true); err != nil {
				return err
			}
			dirty, drawn = false, true
		}
	}
}

// writeStats prints rows as a table or JSON. streaming: JSON is one line;
// a table on a terminal replaces the previous one.
func writeStats(c *Call, rows []StatsRow, asJSON, streaming bool) error {
	w := c.env.Stdout
	if asJSON {
		if !streaming {
			return writeJSON(w, rows)
		}
		b, err := json.Marshal(rows)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if streaming {
		if c.env.StdoutTTY {
			io.WriteString(w, "\x1b[H\x1b[2J") // home, clear
		} else {
			defer io.WriteString(w, "\n")
		}
	}
	t := newTable(w, "NAME", "STATE", "CPU", "GUEST", "MEM", "MEM%", "RSS", "DISK R/W", "HOST R/W", "DIRTY", "RUNNING")
	for _, r := range rows {
		mem := session.FormatBytes(r.MemUsedBytes) + " / " + session.FormatBytes(r.MemoryLimitBytes)
		memPct := "-"
		if r.MemoryLimitBytes > 0 && r.MemUsedBytes > 0 {
			memPct = fmt.Sprintf("%.1f%%", float64(r.MemUsedBytes)/float64(r.MemoryLimitBytes)*100)
		}
		cpu, guest, rss, disk, host := "-", "-", "-", "-", "-"
		if lv := r.Live; lv != nil {
			cpu, guest = fmt.Sprintf("%.1f%%", lv.CPUPercent), fmt.Sprintf("%.1f%%", lv.GuestCPUPercent)
			rss = session.FormatBytes(lv.RSSBytes)
			disk = rateText(lv.WorkspaceReadBps+lv.SystemReadBps) + " / " + rateText(lv.WorkspaceWriteBps+lv.SystemWriteBps)
			host = rateText(lv.HostReadBps) + " / " + rateText(lv.HostWriteBps)
		}
		t.row(r.Name, string(r.State), cpu, guest, mem, memPct, rss, disk, host, session.FormatBytes(r.DirtyBytes), fmt.Sprint(r.Running))
	}
	return t.flush()
}

// rateText prints bytes per second: "0B/s", "1.5M/s".
func rateText(bps float64) string {
	return session.FormatBytes(int64(bps+0.5)) + "/s"
}
