package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Progress is one step of a build, for people watching it. Phases:
// resolve, download, unpack, image, setup, done.
type Progress struct {
	Phase string `json:"phase"`
	// Done and Total count packages (download, unpack) or steps (setup).
	Done  int `json:"done,omitempty"`
	Total int `json:"total,omitempty"`
	// Bytes and TotalBytes are downloaded or written bytes.
	Bytes      int64 `json:"bytes,omitempty"`
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Line is a message or a line of a setup command's output.
	Line string `json:"line,omitempty"`
}

func (p Progress) String() string {
	var b strings.Builder
	b.WriteString(p.Phase)
	if p.Total > 0 {
		fmt.Fprintf(&b, " %d/%d", p.Done, p.Total)
	}
	if p.TotalBytes > 0 {
		fmt.Fprintf(&b, " %s/%s", mbytes(p.Bytes), mbytes(p.TotalBytes))
	} else if p.Bytes > 0 {
		fmt.Fprintf(&b, " %s", mbytes(p.Bytes))
	}
	if p.Line != "" {
		b.WriteString(": " + p.Line)
	}
	return b.String()
}

func mbytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// aptTracker turns mmdebstrap's verbose output (apt's and dpkg's lines)
// into Progress. apt runs twice (the essential set, then the rest), so the
// totals grow when the second run resolves.
type aptTracker struct {
	report           func(Progress)
	total, got, unpk int
	totalBytes, done int64
	phase            string
	last             []string // the last lines, for error messages
}

var (
	newlyRE = regexp.MustCompile(`(\d+) newly installed`)
	needRE  = regexp.MustCompile(`^Need to get ([\d.,]+) ([kMG]?B)`)
	getRE   = regexp.MustCompile(`^Get:\d+ \S+ \S+ \S+ (\S+) .*\[([\d.,]+) ([kMG]?B)\]$`)
)

func parseAptSize(num, unit string) int64 {
	v, _ := strconv.ParseFloat(strings.ReplaceAll(num, ",", ""), 64)
	switch unit {
	case "kB":
		v *= 1e3
	case "MB":
		v *= 1e6
	case "GB":
		v *= 1e9
	}
	return int64(v)
}

func (t *aptTracker) line(l string) {
	l = strings.TrimRight(l, "\r")
	if len(t.last) == 8 {
		t.last = t.last[1:]
	}
	t.last = append(t.last, l)
	switch {
	case strings.HasPrefix(l, "I: running apt-get update"):
		t.phase = "resolve"
		t.report(Progress{Phase: "resolve", Line: "reading Debian's package lists"})
	case newlyRE.MatchString(l):
		n, _ := strconv.Atoi(newlyRE.FindStringSubmatch(l)[1])
		t.total += n
	case needRE.MatchString(l):
		m := needRE.FindStringSubmatch(l)
		t.totalBytes += parseAptSize(m[1], m[2])
		t.phase = "download"
		t.report(Progress{Phase: "resolve", Total: t.total, TotalBytes: t.totalBytes, Line: fmt.Sprintf("%d packages to install", t.total)})
	case t.phase == "download" && getRE.MatchString(l):
		m := getRE.FindStringSubmatch(l)
		t.got++
		t.done += parseAptSize(m[2], m[3])
		t.report(Progress{Phase: "download", Done: t.got, Total: t.total, Bytes: t.done, TotalBytes: t.totalBytes, Line: m[1]})
	case strings.HasPrefix(l, "Unpacking "):
		t.unpk++
		name, _, _ := strings.Cut(strings.TrimPrefix(l, "Unpacking "), " ")
		t.report(Progress{Phase: "unpack", Done: t.unpk, Total: t.total, Line: name})
	case strings.HasPrefix(l, "I: installing remaining packages"):
		t.phase = ""
	}
}

// aptError picks the line that says why apt or mmdebstrap failed.
func (t *aptTracker) aptError() string {
	for i := len(t.last) - 1; i >= 0; i-- {
		if l := t.last[i]; strings.HasPrefix(l, "E: ") {
			return strings.TrimPrefix(l, "E: ")
		}
	}
	if len(t.last) > 0 {
		return t.last[len(t.last)-1]
	}
	return ""
}

// debootstrap installs Debian with packages into dir (which must not exist
// or be empty) with mmdebstrap, reporting progress.
//
// Downloaded packages are kept in debs (mmdebstrap's documented sync-in /
// sync-out hooks), so a rebuild with a package more downloads one package.
func debootstrap(ctx context.Context, dir, debs string, packages []string, report func(Progress)) (installed int, err error) {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return 0, errors.New("mmdebstrap not found: install Debian's mmdebstrap package")
	}
	args := []string{"--verbose", "--variant=apt", "--format=directory"}
	if debs != "" {
		if err := os.MkdirAll(debs, 0o755); err != nil {
			return 0, err
		}
		args = append(args, "--skip=essential/unlink",
			`--setup-hook=mkdir -p "$1"/var/cache/apt/archives/`,
			"--setup-hook=sync-in "+debs+" /var/cache/apt/archives/",
			"--customize-hook=sync-out /var/cache/apt/archives "+debs)
	}
	if len(packages) > 0 {
		args = append(args, "--include="+strings.Join(packages, ","))
	}
	// Documentation and translations are most of a Debian root's files
	// and no sandbox reads them.
	args = append(args,
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-include=/usr/share/locale/locale.alias",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		Suite, dir)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	t := &aptTracker{report: report}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.line(sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	err = cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("mmdebstrap: %w", ctx.Err())
		}
		return 0, fmt.Errorf("mmdebstrap %s failed (%v): %s", Suite, err, t.aptError())
	}
	return t.total, nil
}

// treeSize sums what a tree needs in an ext4 filesystem: data blocks and
// one inode per entry.
func treeSize(root string) (bytes int64, inodes int64, err error) {
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		bytes += (fi.Size() + 4095) &^ 4095
		if d.IsDir() {
			bytes += 4096
		}
		return nil
	})
	return bytes, inodes, err
}

// makeLayer writes dir's tree into a new ext4 image at file without
// mounting anything (mkfs.ext4 -d). The layer is read-only in every VM, so
// it has no journal; it has headroom for nothing but the tree.
func makeLayer(ctx context.Context, dir, file, uuid string) (int64, error) {
	used, inodes, err := treeSize(dir)
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	size := used + used/10 + 64<<20 // metadata, directories, rounding
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		os.Remove(file)
		return 0, err
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", dir, "-U", uuid, "-L", "berth-layer",
		"-O", "^has_journal,^resize_inode", "-m", "0", "-N", strconv.FormatInt(inodes+inodes/5+1024, 10),
		"-E", "lazy_itable_init=1", file)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(file)
		if _, lerr := exec.LookPath("mkfs.ext4"); lerr != nil {
			return 0, errors.New("mkfs.ext4 not found (install Debian's e2fsprogs)")
		}
		return 0, fmt.Errorf("mkfs.ext4 -d %s: %w: %s", dir, err, lastLine(string(out)))
	}
	return size, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// customize makes an installed Debian tree a berth guest's root: the
// agent writes hostname and machine-id per session at boot, commands get
// a UTF-8 locale, and nothing expects systemd to run.
func customize(root string) error {
	write := func(name, content string, perm fs.FileMode) error {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		os.Remove(p) // a symlink (e.g. resolv.conf) must not be followed out
		return os.WriteFile(p, []byte(content), perm)
	}
	for _, f := range []struct {
		name, content string
		perm          fs.FileMode
	}{
		{"etc/machine-id", "", 0o444}, // empty: "not yet set", per machine-id(5)
		{"etc/hostname", "berth\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/default/locale", "LANG=C.UTF-8\n", 0o644},
		{"etc/fstab", "# berth: the agent mounts the root overlay and /workspace\n", 0o644},
		{"etc/resolv.conf", "", 0o644},
	} {
		if err := write(f.name, f.content, f.perm); err != nil {
			return fmt.Errorf("customize the root: %w", err)
		}
	}
	os.Remove(filepath.Join(root, "var/lib/dbus/machine-id"))
	for _, d := range []string{"workspace", "root", "tmp", "run", "proc", "sys", "dev"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "root"), 0o700)
	return nil
}

// filesTar packs a recipe's host files and trees into a tar whose
// entries are named by their paths in the image (relative to /), keeping
// modes and symlinks as they are.
func filesTar(files []fileCopy) ([]byte, error) {
	if len(files) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	const limit = 1 << 30
	for _, f := range files {
		dst := strings.TrimPrefix(f.dst, "/")
		err := filepath.WalkDir(f.src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(f.src, p)
			name := path.Join(dst, filepath.ToSlash(rel))
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			h := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}
			switch {
			case fi.IsDir():
				h.Typeflag, h.Name = tar.TypeDir, name+"/"
				return tw.WriteHeader(h)
			case fi.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				h.Typeflag, h.Linkname = tar.TypeSymlink, t
				return tw.WriteHeader(h)
			case fi.Mode().IsRegular():
				if buf.Len()+int(fi.Size()) > limit {
					return fmt.Errorf("the recipe's files are over %d bytes: install big things with a setup step instead", limit)
				}
				h.Typeflag, h.Size = tar.TypeReg, fi.Size()
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				in, err := os.Open(p)
				if err != nil {
					return err
				}
				defer in.Close()
				_, err = io.CopyN(tw, in, fi.Size())
				return err
			}
			return fmt.Errorf("%s: not a regular file, directory or symlink", p)
		})
		if err != nil {
			return nil, fmt.Errorf("files: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
