package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Reading an ext4 image's tree without mounting it: debugfs lists
// directories by inode number ("ls -p <12>"), one debugfs run per level
// of the tree. The image is a guest's (a copy of a session's system
// disk), so what it holds is untrusted: no name read from it is ever put
// into a debugfs command (directories are named by inode), the output is
// parsed by its field separators (a name holds any byte but '/' and NUL,
// newlines included), and the walk is bounded in entries and depth.

// extNode is one directory entry of a walked tree.
type extNode struct {
	ino    uint32
	mode   uint32 // st_mode: type and permissions
	size   int64  // i_size
	parent int32  // index of the directory it is in; -1 for the root
	name   string
}

func (n extNode) isDir() bool  { return n.mode&syscall.S_IFMT == syscall.S_IFDIR }
func (n extNode) isChar() bool { return n.mode&syscall.S_IFMT == syscall.S_IFCHR }

// extTree is a walked tree: nodes[0] is the root directory.
type extTree struct{ nodes []extNode }

// path is node i's path from the root: "/upper/etc/hosts"; "" for the
// root.
func (t *extTree) path(i int) string {
	var parts []string
	for ; i > 0; i = int(t.nodes[i].parent) {
		parts = append(parts, t.nodes[i].name)
	}
	var b strings.Builder
	for k := len(parts) - 1; k >= 0; k-- {
		b.WriteByte('/')
		b.WriteString(parts[k])
	}
	return b.String()
}

// walkLimits bound a walk.
type walkLimits struct {
	entries int // directory entries in all
	depth   int // levels of directories
}

var defaultWalkLimits = walkLimits{entries: 1 << 20, depth: 1024}

// walkExt4 lists the whole tree of the ext4 image file, breadth first. A
// directory reached twice (a corrupt or crafted image) is listed once.
func walkExt4(ctx context.Context, file string, lim walkLimits) (*extTree, error) {
	t := &extTree{nodes: []extNode{{ino: 2, mode: syscall.S_IFDIR | 0o755, parent: -1}}}
	seen := map[uint32]bool{2: true}
	level := []int{0}
	for depth := 0; len(level) > 0; depth++ {
		if depth >= lim.depth {
			return nil, fmt.Errorf("its tree is more than %d directories deep", lim.depth)
		}
		byIno := make(map[uint32]int, len(level))
		var cmds bytes.Buffer
		for _, i := range level {
			byIno[t.nodes[i].ino] = i
			fmt.Fprintf(&cmds, "ls -p <%d>\n", t.nodes[i].ino)
		}
		var next []int
		err := runDebugfs(ctx, file, false, &cmds, func(out *bufio.Reader) error {
			return parseListings(out, func(dir uint32, n extNode) error {
				parent, ok := byIno[dir]
				if !ok {
					return fmt.Errorf("debugfs listed directory %d, which was not asked for", dir)
				}
				if len(t.nodes) >= lim.entries {
					return fmt.Errorf("it holds more than %d paths", lim.entries)
				}
				n.parent = int32(parent)
				t.nodes = append(t.nodes, n)
				if n.isDir() && !seen[n.ino] {
					seen[n.ino] = true
					next = append(next, len(t.nodes)-1)
				}
				return nil
			})
		})
		if err != nil {
			return nil, err
		}
		level = next
	}
	return t, nil
}

// parseListings reads debugfs's answers to "ls -p <N>" commands: each
// command echoed ("debugfs: ls -p <N>"), then an entry a line
// ("/ino/mode/uid/gid/name/size/", size empty for a directory), then an
// empty line. Entries "." and "..", and cleared ones (inode 0), are
// skipped.
func parseListings(r *bufio.Reader, entry func(dir uint32, n extNode) error) error {
	var dir uint32
	have := false
	for {
		c, err := r.ReadByte()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch c {
		case '\n':
		case 'd':
			line, err := readField(r, '\n', 128)
			if err != nil {
				return err
			}
			n, ok := strings.CutPrefix(line, "ebugfs: ls -p <")
			if !ok || !strings.HasSuffix(n, ">") {
				return fmt.Errorf("unexpected debugfs output %q", "d"+line)
			}
			v, err := strconv.ParseUint(strings.TrimSuffix(n, ">"), 10, 32)
			if err != nil {
				return fmt.Errorf("unexpected debugfs output %q", "d"+line)
			}
			dir, have = uint32(v), true
		case '/':
			var f [6]string
			for k := range f {
				limit := 32
				if k == 4 {
					limit = 1024 // a name: ext4 allows 255 bytes
				}
				if f[k], err = readField(r, '/', limit); err != nil {
					return err
				}
			}
			if nl, err := r.ReadByte(); err != nil || nl != '\n' {
				return errors.New("unexpected debugfs output: an entry not ended by a newline")
			}
			ino, err1 := strconv.ParseUint(f[0], 10, 32)
			mode, err2 := strconv.ParseUint(f[1], 8, 32)
			if err1 != nil || err2 != nil || !have {
				return fmt.Errorf("unexpected debugfs entry %q", strings.Join(f[:4], "/"))
			}
			if ino == 0 || f[4] == "." || f[4] == ".." || f[4] == "" {
				continue
			}
			var size int64
			if f[5] != "" {
				if size, err = strconv.ParseInt(f[5], 10, 64); err != nil || size < 0 {
					return fmt.Errorf("unexpected debugfs entry size %q", f[5])
				}
			}
			if err := entry(dir, extNode{ino: uint32(ino), mode: uint32(mode), size: size, name: f[4]}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected debugfs output starting %q", c)
		}
	}
}

// readField reads up to delim (consumed, not returned), at most limit
// bytes before it.
func readField(r *bufio.Reader, delim byte, limit int) (string, error) {
	var b []byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", fmt.Errorf("debugfs output: %w", err)
		}
		if c == delim {
			return string(b), nil
		}
		if len(b) == limit {
			return "", fmt.Errorf("debugfs output: a field over %d bytes", limit)
		}
		b = append(b, c)
	}
}

// runDebugfs runs debugfs on file with the commands in cmds (read-write
// with write), handing its standard output to read as it comes. Its
// standard error (the banner, and a failed command's complaint) is kept
// for the error.
func runDebugfs(ctx context.Context, file string, write bool, cmds io.Reader, read func(*bufio.Reader) error) error {
	args := []string{"-f", "-"}
	if write {
		args = append(args, "-w")
	}
	cmd := exec.CommandContext(ctx, "debugfs", append(args, file)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = cmds
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{b: &stderr, n: 64 << 10}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		if _, lerr := exec.LookPath("debugfs"); lerr != nil {
			return errors.New("debugfs not found (install Debian's e2fsprogs)")
		}
		return err
	}
	rerr := read(bufio.NewReaderSize(out, 256<<10))
	if rerr != nil {
		cmd.Process.Kill()
	}
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	switch {
	case rerr != nil:
		return rerr
	case werr != nil:
		return fmt.Errorf("debugfs: %w: %s", werr, lastLine(stderr.String()))
	}
	return nil
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
