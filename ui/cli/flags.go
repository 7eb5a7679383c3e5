package cli

import (
	"flag"
	"fmt"
	"sort"
	"strings"

	"github.com/berthvm/berth/session"
)

// parseInterleaved parses flags anywhere among the positional arguments,
// as in "berth ls --json" or "berth files demo -l". "--" ends the flags.
// Once stopAfter positional arguments are seen (stopAfter >= 0), the rest
// is taken as is: "berth exec demo ls -la".
func parseInterleaved(fs *flag.FlagSet, args []string, stopAfter int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		if stopAfter >= 0 && len(pos) >= stopAfter {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// checkName refuses, before connecting, what the service would refuse:
// the same rule, as a usage error.
func checkName(name string) error {
	if err := session.ValidateName(name); err != nil {
		return &exitError{code: ExitUsage, msg: err.Error()}
	}
	return nil
}

// flagGiven reports whether the command line set the flag name, so a
// flag whose zero value means "the default" can refuse an explicit zero.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}

// sizeFlag is a flag holding a byte size (session.ParseSize).
type sizeFlag struct{ n int64 }

func (f *sizeFlag) String() string {
	if f == nil || f.n == 0 {
		return ""
	}
	return session.FormatBytes(f.n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := session.ParseSize(s)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}

// memoryFlag is a flag holding a guest memory size in MiB
// (session.ParseMemory).
type memoryFlag struct{ mib int }

func (f *memoryFlag) String() string {
	if f == nil || f.mib == 0 {
		return ""
	}
	return session.FormatBytes(int64(f.mib) << 20)
}

func (f *memoryFlag) Set(s string) error {
	mib, err := session.ParseMemory(s)
	if err != nil {
		return err
	}
	f.mib = mib
	return nil
}

// envFlag collects repeated --env K=V.
type envFlag map[string]string

func (f envFlag) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (f envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || strings.ContainsAny(k, " \t\x00") {
		return fmt.Errorf("want NAME=VALUE")
	}
	f[k] = v
	return nil
}

// choiceFlag is a string flag limited to some values.
type choiceFlag struct {
	value   string
	choices []string
}

func (f *choiceFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}

func (f *choiceFlag) Set(s string) error {
	for _, c := range f.choices {
		if s == c {
			f.value = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(f.choices, " or "))
}
