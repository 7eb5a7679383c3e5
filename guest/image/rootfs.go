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
	// errs are the last lines that may say why a run failed: apt's and
	// mmdebstrap's errors and warnings, and the complaints of the tools
	// mmdebstrap runs (tar, dpkg…). The cause can be dozens of lines
	// before mmdebstrap's closing "E: mmdebstrap failed to run".
	errs []string
}

// maxErrLines bounds aptTracker.errs.
const maxErrLines = 64

var (
	// toolRE is a line a tool mmdebstrap runs prints about a failure.
	toolRE = regexp.MustCompile(`^(tar|dpkg|dpkg-deb|apt-get|apt|cp|mv|rm|mkdir|ln|mount|chroot|sh|gpgv|unshare|newuidmap|newgidmap): |No space left on device`)
	// wrapperRE is an error line of mmdebstrap's that only says some
	// step failed; the step's own message came before it.
	wrapperRE = regexp.MustCompile(`^E: (mmdebstrap failed to run$|(setup|hookhelper) failed: |.*failed( with exit code \d+|: -?\d+)?$)`)
)

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
	if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "W: ") || strings.HasPrefix(l, "Err:") || toolRE.MatchString(l) {
		if len(t.errs) == maxErrLines {
			t.errs = t.errs[1:]
		}
		t.errs = append(t.errs, l)
	}
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

// aptError picks the one line that says why apt or mmdebstrap failed:
// the first error that is more than mmdebstrap saying a step failed
// (apt's "E: Unable to locate package x"), else what the failed step's
// tool said (tar's, dpkg's…) or a warning, else mmdebstrap's first
// error, else the last line.
func (t *aptTracker) aptError() string {
	clip := func(l string) string {
		l = strings.TrimPrefix(l, "E: ")
		if len(l) > 400 {
			l = l[:400] + "…"
		}
		return l
	}
	for _, l := range t.errs {
		if strings.HasPrefix(l, "E: ") && !wrapperRE.MatchString(l) {
			return clip(l)
		}
	}
	first := -1
	for i, l := range t.errs {
		if strings.HasPrefix(l, "E: ") {
			first = i
			break
		}
	}
	end := len(t.errs)
	if first >= 0 {
		end = first
	}
	if end > 0 { // the tool's complaint just before
		return clip(t.errs[end-1])
	}
	if first >= 0 {
		return clip(t.errs[first])
	}
	if len(t.last) > 0 {
		return clip(t.last[len(t.last)-1])
	}
	return ""
}

// debootstrap installs Debian with packages into dir (which must not exist
// or be empty) with mmdebstrap, reporting progress. scratch is a
// directory of the build's own, on the filesystem of dir.
//
// Downloaded packages are kept in debs (mmdebstrap's documented sync-in /
// sync-out hooks), so a rebuild with a package more downloads one package.
// debs is shared with every other build using the cache, at the same
// time too: mmdebstrap reads a snapshot of it (hard links, made in
// scratch) and writes into scratch, and only whole packages of a build
// that succeeded are linked into debs, so no build ever sees another's
// half-copied file.
func debootstrap(ctx context.Context, dir, debs, scratch string, packages []string, report func(Progress)) (installed int, err error) {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return 0, errors.New("mmdebstrap not found: install Debian's mmdebstrap package")
	}
	args := []string{"--verbose", "--variant=apt", "--format=directory"}
	var debsOut string
	if debs != "" {
		in, out, err := stageDebs(debs, scratch)
		if err != nil {
			return 0, fmt.Errorf("package cache %s: %w", debs, err)
		}
		debsOut = out
		args = append(args, "--skip=essential/unlink",
			`--setup-hook=mkdir -p "$1"/var/cache/apt/archives/`,
			"--setup-hook=sync-in "+in+" /var/cache/apt/archives/",
			"--customize-hook=sync-out /var/cache/apt/archives "+out)
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
	if debsOut != "" {
		if err := publishDebs(debsOut, debs); err != nil {
			// The root is built; the next build downloads again.
			report(Progress{Phase: "image", Line: fmt.Sprintf("keeping the downloaded packages in %s failed: %v", debs, err)})
		}
	}
	return t.total, nil
}

// isDeb reports whether name is a package a cache holds (not a
// temporary file, not apt's lock or partial directory).
func isDeb(name string) bool {
	return strings.HasSuffix(name, ".deb") && !strings.HasPrefix(name, ".")
}

// stageDebs makes scratch/debs-in a snapshot of the shared cache debs
// (hard links; copies where debs is on another filesystem) and an empty
// scratch/debs-out for mmdebstrap to fill.
func stageDebs(debs, scratch string) (in, out string, err error) {
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", "", err
	}
	in, out = filepath.Join(scratch, "debs-in"), filepath.Join(scratch, "debs-out")
	for _, d := range []string{in, out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", err
		}
	}
	ents, err := os.ReadDir(debs)
	if err != nil {
		return "", "", err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !isDeb(e.Name()) {
			continue
		}
		src, dst := filepath.Join(debs, e.Name()), filepath.Join(in, e.Name())
		if err := os.Link(src, dst); err != nil {
			if err := copyFile(src, dst); err != nil {
				return "", "", err
			}
		}
	}
	return in, out, nil
}

// publishDebs adds the packages in out that debs lacks, each whole:
// linked in (or copied aside and linked), never written in place. A
// package's file name holds its version, so one already there is the
// same package.
func publishDebs(out, debs string) error {
	ents, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !isDeb(e.Name()) {
			continue
		}
		src, dst := filepath.Join(out, e.Name()), filepath.Join(debs, e.Name())
		err := os.Link(src, dst)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			tmp := filepath.Join(debs, ".tmp-"+randHex(6)+"-"+e.Name())
			if err = copyFile(src, tmp); err == nil {
				if err = syncFile(tmp); err == nil {
					err = os.Link(tmp, dst)
				}
			}
			os.Remove(tmp)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return syncDir(debs)
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
