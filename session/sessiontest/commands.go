package sessiontest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"time"
)

// A Command is a program the fake can run. It reads p.Stdin, writes
// p.Stdout and p.Stderr, and returns the exit code. It must return soon
// after ctx ends. Returning a Signal means "killed by that signal"; any
// other error means the command could not start (ExecFailed).
type Command func(ctx context.Context, p *Proc) (int, error)

// Signal is the error a Command returns when it was killed by a signal,
// named like "SIGTERM".
type Signal string

func (s Signal) Error() string { return "killed by " + string(s) }

// Proc is what a Command sees of its process.
type Proc struct {
	Args   []string
	Env    map[string]string
	Cwd    string
	TTY    bool
	Pid    int
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer

	e *fakeExec
}

// Size returns the terminal size (0, 0 without a terminal).
func (p *Proc) Size() (rows, cols int) {
	p.e.f.mu.Lock()
	defer p.e.f.mu.Unlock()
	return p.e.rows, p.e.cols
}

// Resized receives a value after the caller resized the terminal.
func (p *Proc) Resized() <-chan struct{} { return p.e.resized }

// ReadFile reads a workspace file; path is relative to /workspace or
// absolute under it.
func (p *Proc) ReadFile(path string) ([]byte, error) {
	f := p.e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _, err := p.e.s.find(path, true)
	if err != nil {
		return nil, err
	}
	if n.dir {
		return nil, fmt.Errorf("%s: is a directory", path)
	}
	return bytes.Clone(n.data), nil // open Files write in place
}

func (p *Proc) command(name string) Command {
	f := p.e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commands[name]
}

func cloneEnv(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// builtins are the commands every Fake knows (listed in the package doc).
func builtins() map[string]Command {
	return map[string]Command{
		"echo":     echo,
		"cat":      cat,
		"sleep":    sleep,
		"true":     func(context.Context, *Proc) (int, error) { return 0, nil },
		"false":    func(context.Context, *Proc) (int, error) { return 1, nil },
		"pwd":      func(_ context.Context, p *Proc) (int, error) { fmt.Fprintln(p.Stdout, p.Cwd); return 0, nil },
		"printenv": printenv,
		"kill":     kill,
		"stty":     stty,
		"head":     head,
		"sh":       sh,
	}
}

func echo(_ context.Context, p *Proc) (int, error) {
	args, nl := p.Args[1:], "\n"
	if len(args) > 0 && args[0] == "-n" {
		args, nl = args[1:], ""
	}
	fmt.Fprint(p.Stdout, strings.Join(args, " ")+nl)
	return 0, nil
}

func cat(ctx context.Context, p *Proc) (int, error) {
	if len(p.Args) < 2 {
		if _, err := io.Copy(p.Stdout, p.Stdin); err != nil && ctx.Err() == nil {
			fmt.Fprintf(p.Stderr, "cat: %v\n", err)
			return 1, nil
		}
		return 0, nil
	}
	status := 0
	for _, name := range p.Args[1:] {
		data, err := p.ReadFile(name)
		if err != nil {
			fmt.Fprintf(p.Stderr, "cat: can't open '%s': %v\n", name, err)
			status = 1
			continue
		}
		p.Stdout.Write(data)
	}
	return status, nil
}

func sleep(ctx context.Context, p *Proc) (int, error) {
	if len(p.Args) != 2 {
		fmt.Fprintln(p.Stderr, "usage: sleep SECONDS")
		return 1, nil
	}
	secs, err := strconv.ParseFloat(p.Args[1], 64)
	if err != nil {
		fmt.Fprintf(p.Stderr, "sleep: invalid number '%s'\n", p.Args[1])
		return 1, nil
	}
	t := time.NewTimer(time.Duration(secs * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return 0, nil
	case <-ctx.Done():
		return 0, Signal("SIGKILL")
	}
}

func printenv(_ context.Context, p *Proc) (int, error) {
	if len(p.Args) != 2 {
		return 1, nil
	}
	v, ok := p.Env[p.Args[1]]
	if !ok {
		return 1, nil
	}
	fmt.Fprintln(p.Stdout, v)
	return 0, nil
}

func kill(_ context.Context, p *Proc) (int, error) {
	if len(p.Args) != 3 || !strings.HasPrefix(p.Args[1], "-") {
		fmt.Fprintln(p.Stderr, "usage: kill -SIG PID")
		return 1, nil
	}
	if p.Args[2] != strconv.Itoa(p.Pid) {
		fmt.Fprintf(p.Stderr, "kill: can't kill pid %s: No such process\n", p.Args[2])
		return 1, nil
	}
	sig := strings.TrimPrefix(p.Args[1], "-")
	if n, err := strconv.Atoi(sig); err == nil {
		names := map[int]string{1: "HUP", 2: "INT", 3: "QUIT", 6: "ABRT", 9: "KILL", 15: "TERM"}
		if sig = names[n]; sig == "" {
			sig = strconv.Itoa(n)
		}
	}
	return 0, Signal("SIG" + strings.TrimPrefix(sig, "SIG"))
}

func stty(_ context.Context, p *Proc) (int, error) {
	if !p.TTY {
		fmt.Fprintln(p.Stderr, "stty: standard input: Not a tty")
		return 1, nil
	}
	rows, cols := p.Size()
	fmt.Fprintf(p.Stdout, "%d %d\n", rows, cols)
	return 0, nil
}

func head(_ context.Context, p *Proc) (int, error) {
	if len(p.Args) != 4 || p.Args[1] != "-c" {
		fmt.Fprintln(p.Stderr, "usage: head -c N FILE")
		return 1, nil
	}
	n, err := strconv.Atoi(p.Args[2])
	if err != nil || n < 0 {
		fmt.Fprintf(p.Stderr, "head: invalid number '%s'\n", p.Args[2])
		return 1, nil
	}
	var data []byte
	if p.Args[3] == "/dev/zero" {
		data = make([]byte, n)
	} else if data, err = p.ReadFile(p.Args[3]); err != nil {
		fmt.Fprintf(p.Stderr, "head: %s: %v\n", p.Args[3], err)
		return 1, nil
	}
	for len(data) > 0 && n > 0 {
		k := min(len(data), n, 16<<10)
		p.Stdout.Write(data[:k])
		data, n = data[k:], n-k
	}
	return 0, nil
}

// sh runs a script given with -c, or reads statements from stdin (printing
// a "$ " prompt on a terminal).
func sh(ctx context.Context, p *Proc) (int, error) {
	if len(p.Args) >= 3 && p.Args[1] == "-c" {
		status := 0
		for _, stmt := range splitStatements(p.Args[2]) {
			var exit bool
			var err error
			if status, exit, err = runStatement(ctx, p, stmt); err != nil || exit {
				return status, err
			}
		}
		return status, nil
	}
	in := bufio.NewReader(p.Stdin)
	status := 0
	for {
		if p.TTY {
			fmt.Fprint(p.Stdout, "$ ")
		}
		line, err := in.ReadString('\n')
		for _, stmt := range splitStatements(line) {
			var exit bool
			var serr error
			if status, exit, serr = runStatement(ctx, p, stmt); serr != nil || exit {
				return status, serr
			}
		}
		if err != nil {
			return status, nil
		}
	}
}

// runStatement runs one statement; exit reports an `exit` builtin.
func runStatement(ctx context.Context, p *Proc, stmt string) (status int, exit bool, err error) {
	words := splitWords(stmt, p.Pid)
	if len(words) == 0 {
		return 0, false, nil
	}
	sub := *p
	var args []string
	for _, w := range words {
		if w == ">&2" || w == "1>&2" {
			sub.Stdout = p.Stderr
			continue
		}
		args = append(args, w)
	}
	sub.Args = args
	if args[0] == "exit" {
		code := 0
		if len(args) > 1 {
			code, _ = strconv.Atoi(args[1])
		}
		return code, true, nil
	}
	cmd := p.command(args[0])
	if cmd == nil || args[0] == "sh" {
		fmt.Fprintf(p.Stderr, "sh: %s: not found\n", args[0])
		return 127, false, nil
	}
	code, err := cmd(ctx, &sub)
	if err != nil {
		return 0, true, err
	}
	if ctx.Err() != nil {
		return 0, true, Signal("SIGKILL")
	}
	return code, false, nil
}

func splitStatements(script string) []string {
	var out []string
	var cur strings.Builder
	var quote rune
	for _, r := range script {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == ';' || r == '\n':
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteRune(r)
	}
	return append(out, cur.String())
}

// splitWords splits a statement into words, honouring quotes and
// backslashes and expanding $$ to pid.
func splitWords(stmt string, pid int) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	rs := []rune(stmt)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\\' && i+1 < len(rs) && quote != '\'':
			i++
			cur.WriteRune(rs[i])
			inWord = true
		case quote == '"' && r == '"':
			quote = 0
		case r == '$' && i+1 < len(rs) && rs[i+1] == '$':
			i++
			cur.WriteString(strconv.Itoa(pid))
			inWord = true
		case quote == '"':
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote = r
			inWord = true
		case r == ' ' || r == '\t' || r == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
