package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/berthvm/berth/session"
)

// ago prints how long ago t was (session.FormatAgo), or "-" for a time
// that never was.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return session.FormatAgo(now.Sub(t))
}

// table writes aligned columns; the first row is the header.
type table struct {
	bw *bufio.Writer
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	// tabwriter writes each cell and each pad separately: buffered, a
	// 1,000-row table is one write instead of 18,000.
	bw := bufio.NewWriterSize(w, 64<<10)
	t := &table{bw: bw, tw: tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error {
	if err := t.tw.Flush(); err != nil {
		return err
	}
	return t.bw.Flush()
}

// writeJSON writes v as indented JSON: the stable, scriptable output.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeList writes a list as JSON, none as [] rather than null, so that
// scripts can iterate over what they get without a check.
// listing is the RunFunc of a verb that lists what session NAME has
// (list is a method expression, session.Service.Runs):
// with --json the list ([] when empty); an empty list says so on
// standard error (a script reading standard output sees no rows);
// otherwise table writes it.
func listing[T any](fs *flag.FlagSet, list func(svc session.Service, ctx context.Context, name string) ([]T, error), empty func(name string) string, table func(c *Call, list []T) error) RunFunc {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, c *Call, args []string) error {
		svc, err := c.service(ctx)
		if err != nil {
			return err
		}
		l, err := list(svc, ctx, args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeList(c.env.Stdout, l)
		}
		if len(l) == 0 {
			fmt.Fprintln(c.env.Stderr, empty(args[0]))
			return nil
		}
		return table(c, l)
	}
}

func writeList[T any](w io.Writer, list []T) error {
	if list == nil {
		list = []T{}
	}
	return writeJSON(w, list)
}

// shellQuote joins argv as a shell would need it typed.
func shellQuote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// plural prints "1 CPU", "2 CPUs".
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
