package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"
)

// Shell completion. The scripts are thin: each asks `berth __complete`
// for the candidates of the word being typed, and the answer comes from
// the command table (commands, their flags, group words) and, for NAME
// arguments, from the daemon's sessions. A new command completes without
// touching this file.

// completeCmd is the hidden command the scripts call: after "--", the
// words typed after "berth", the last one being completed (possibly
// empty); it prints one candidate a line.
func completeCmd() *Command {
	return &Command{
		Name: "__complete", Hidden: true, Args: []string{"[WORD...]"},
		Summary: "print completion candidates (for the shell scripts)",
		Setup: func(*flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				for _, cand := range c.complete(ctx, args) {
					fmt.Fprintln(c.env.Stdout, cand)
				}
				return nil
			}
		},
	}
}

func completionCmd() *Command {
	return &Command{
		Name: "completion", Group: "Shell", Usage: "bash|zsh|fish", Args: []string{"SHELL"},
		Summary: "print a shell completion script",
		Help: "Prints a script that completes berth's commands, their flags and session names\n" +
			"(asked of the daemon when one runs; a Tab never starts one). make install puts\n" +
			"the scripts where bash, zsh and fish look; by hand:",
		Example: "source <(berth completion bash)\n" +
			"berth completion zsh > \"${fpath[1]}/_berth\"\n" +
			"berth completion fish > ~/.config/fish/completions/berth.fish",
		Setup: func(*flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				script, ok := completionScript(args[0])
				if !ok {
					return usageErrorf("no completion for shell %q: use bash, zsh or fish", args[0])
				}
				_, err := io.WriteString(c.env.Stdout, script)
				return err
			}
		},
	}
}

// complete returns the candidates for the last of words.
func (c *Call) complete(ctx context.Context, words []string) []string {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, done := words[len(words)-1], words[:len(words)-1]
	done = skipGlobals(done)
	if done == nil { // a global flag's value is being typed
		return nil
	}
	if len(done) == 0 && strings.HasPrefix(cur, "-") {
		return prefixed(flagNames(globalFlags(&Globals{})), cur)
	}
	// "checkpoint " may go on as "checkpoint rm" or "checkpoint NAME".
	var second []string
	if len(done) == 1 {
		for _, s := range c.table.group(done[0]) {
			second = append(second, strings.Fields(s.Name)[1])
		}
	}
	cmd, n := c.table.lookup(done)
	if cmd == nil {
		if len(done) == 0 || (len(done) == 1 && isHelp(done[0])) {
			return prefixed(c.firstWords(), cur)
		}
		return prefixed(second, cur)
	}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cmd.Setup(fs)
	rest := done[n:]
	if len(rest) > 0 { // the value of a flag that takes one?
		if f := fs.Lookup(strings.TrimLeft(rest[len(rest)-1], "-")); f != nil && strings.HasPrefix(rest[len(rest)-1], "-") && !isBoolFlag(f) && !strings.Contains(rest[len(rest)-1], "=") {
			return nil
		}
	}
	if strings.HasPrefix(cur, "-") {
		return prefixed(flagNames(fs), cur)
	}
	pos := positional(fs, rest)
	names := pos < len(cmd.Args) && strings.Trim(cmd.Args[pos], "[].") == "NAME"
	if last := len(cmd.Args) - 1; last >= 0 && pos >= last && cmd.Args[last] == "[NAME...]" {
		names = true
	}
	if names {
		return prefixed(append(second, c.sessionNames(ctx)...), cur)
	}
	return prefixed(second, cur)
}

// skipGlobals drops the global flags before the command; nil when the
// last word is a global flag awaiting its value.
func skipGlobals(words []string) []string {
	g := globalFlags(&Globals{})
	for len(words) > 0 && strings.HasPrefix(words[0], "-") {
		name, _, hasValue := strings.Cut(strings.TrimLeft(words[0], "-"), "=")
		f := g.Lookup(name)
		words = words[1:]
		if f != nil && !hasValue && !isBoolFlag(f) {
			if len(words) == 0 {
				return nil
			}
			words = words[1:]
		}
	}
	if words == nil {
		return []string{}
	}
	return words
}

// positional counts the positional arguments among words (flags and
// their values left out).
func positional(fs *flag.FlagSet, words []string) int {
	n := 0
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") || w == "-" {
			n++
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) {
			i++
		}
	}
	return n
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func flagNames(fs *flag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if len(f.Name) == 1 {
			out = append(out, "-"+f.Name)
		} else {
			out = append(out, "--"+f.Name)
		}
	})
	return out
}

// firstWords are the words a command line can begin with.
func (c *Call) firstWords() []string {
	var out []string
	for _, cmd := range c.table {
		if cmd.Name == "" || cmd.Hidden {
			continue
		}
		if w := strings.Fields(cmd.Name)[0]; !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return append(out, "help")
}

// sessionNames asks the daemon for its sessions, briefly; nothing when no
// daemon runs (a Tab never starts one).
func (c *Call) sessionNames(ctx context.Context) []string {
	connect := c.env.ConnectRunning
	if connect == nil {
		connect = c.env.Connect
	}
	if connect == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	svc, err := connect(ctx)
	if err != nil {
		return nil
	}
	if cl, ok := svc.(io.Closer); ok {
		defer cl.Close()
	}
	list, err := svc.List(ctx)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(list))
	for _, s := range list {
		names = append(names, s.Name)
	}
	return names
}

func prefixed(cands []string, prefix string) []string {
	var out []string
	for _, c := range cands {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// completionScript returns the script for shell. Each passes the words
// after "berth" up to the cursor, the current (possibly empty) word last.
func completionScript(shell string) (string, bool) {
	switch shell {
	case "bash":
		return bashCompletion, true
	case "zsh":
		return zshCompletion, true
	case "fish":
		return fishCompletion, true
	}
	return "", false
}

const bashCompletion = `# bash completion for berth (berth completion bash)
_berth() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	local IFS=$'\n'
	COMPREPLY=($(berth __complete -- "${COMP_WORDS[@]:1:COMP_CWORD-1}" "$cur" 2>/dev/null))
}
complete -o default -F _berth berth
`

const zshCompletion = `#compdef berth
# zsh completion for berth (berth completion zsh)
_berth() {
	local -a cands
	cands=("${(@f)$(berth __complete -- "${(@)words[2,CURRENT-1]}" "${words[CURRENT]}" 2>/dev/null)}")
	if (( ${#cands} )) && [[ -n ${cands[1]} ]]; then
		compadd -a cands
	else
		_files
	fi
}
compdef _berth berth
`

const fishCompletion = `# fish completion for berth (berth completion fish)
function __berth_complete
	set -l words (commandline -opc)
	set -e words[1]
	berth __complete -- $words (commandline -ct) 2>/dev/null
end
complete -c berth -f -a '(__berth_complete)'
`
