// Command berth-etcd runs one embedded etcd member for a berth fleet; it
// is what `berth etcd` runs. etcd's server lives in this binary of its
// own, not in berth's, because its packages' start-up (metrics
// registration, protocol tables) would add about 5 ms to every berth
// command, exec included.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/berthvm/berth/session/fleet/member"
	"github.com/berthvm/berth/session/fleet/memberconf"
)

func main() {
	fs := flag.NewFlagSet("berth etcd", flag.ContinueOnError)
	var c memberconf.Config
	c.Bind(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := c.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "berth etcd:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := member.Run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "berth etcd:", strings.ReplaceAll(err.Error(), "\n", "; "))
		stop()
		os.Exit(1)
	}
}
