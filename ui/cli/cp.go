package cli

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/berthvm/berth/guest/tree"
	"github.com/berthvm/berth/session"
)

func cpCmd() *Command {
	return &Command{
		Name: "cp", Action: session.ActionWriteFile, Group: "Files", Usage: "SRC DST [--run ID]", Args: []string{"SRC", "DST"},
		Summary: "copy files or directory trees in or out of a session, durably",
		Help: `One of SRC and DST is NAME:PATH, a path in session NAME's /workspace (relative to it or
absolute under it); the other is a local path, or '-' for a tar stream on stdin or stdout.
A directory is copied whole, with modes, mtimes and the symlinks inside it; a symlink that
points out of the tree being copied is refused, never followed. As with docker cp, copying
into an existing directory puts SRC inside it; otherwise DST becomes the copy.

The copy is durable when cp succeeds: files are written under temporary names, synced (in
batches, with one filesystem sync each), and only then renamed into place. A copy to a new
name is built under a temporary one and renamed last, so a refused or interrupted copy
leaves nothing under the name (and the same cp again means what it meant); into an
existing directory, it leaves no partial file under a final name. A local tree is checked
whole before anything is sent. Progress goes to stderr for copies over 8 MB.`,
		Example: "berth cp ./src demo:src\nberth cp demo:out ./results\ntar c src | berth cp - demo:.",
		Setup: func(fs *flag.FlagSet) RunFunc {
			run := runFlag(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				ctx, err := inRun(ctx, *run)
				if err != nil {
					return err
				}
				srcName, srcPath, srcRemote := splitRemote(args[0])
				dstName, dstPath, dstRemote := splitRemote(args[1])
				switch {
				case srcRemote && dstRemote:
					return usageErrorf("both SRC and DST are in sessions; one side must be local (or -)")
				case !srcRemote && !dstRemote:
					return usageErrorf("neither SRC nor DST names a session: write one as NAME:PATH")
				}
				name := srcName
				if dstRemote {
					name = dstName
				}
				if err := session.ValidateName(name); err != nil {
					return &exitError{code: ExitUsage, msg: err.Error()}
				}
				local := args[1]
				if dstRemote {
					local = args[0]
				}
				if local != "-" && c.env.NoLocalFiles {
					return usageErrorf("there are no local files here: use - for a tar stream on stdin or stdout")
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if dstRemote {
					return c.copyIn(ctx, svc, local, name, dstPath)
				}
				return c.copyOut(ctx, svc, name, srcPath, local)
			}
		},
	}
}

// splitRemote reads NAME:PATH. A local path that contains a colon can be
// written ./a:b.
func splitRemote(arg string) (name, p string, remote bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return "", arg, false
	}
	p = arg[i+1:]
	if p == "" {
		p = "."
	}
	return arg[:i], p, true
}

// copyIn uploads a local file or tree (or a tar on stdin) to NAME:dst.
func (c *Call) copyIn(ctx context.Context, svc session.Service, local, name, dst string) error {
	if local == "-" {
		res, err := svc.CopyIn(ctx, name, dst, c.env.Stdin)
		if err != nil {
			return err
		}
		c.copied(res, name+":"+dst)
		return nil
	}
	fi, err := os.Stat(local) // a symlink given as SRC is followed; those inside are not
	if err != nil {
		return err
	}
	// Where it lands: inside dst when dst is a directory, else as dst.
	intoDir, entryName := dst, filepath.Base(filepath.Clean(local))
	if rfi, err := svc.Stat(ctx, name, dst); err == nil && rfi.IsDir() {
		if fi.IsDir() {
			intoDir = path.Join(dst, entryName)
		}
	} else if err != nil && !errors.Is(err, session.ErrNotFound) {
		return err
	} else if fi.IsDir() {
		intoDir = dst
	} else {
		intoDir, entryName = path.Dir(dst), path.Base(dst)
	}
	srcDir, srcEntry := filepath.Dir(filepath.Clean(local)), filepath.Base(filepath.Clean(local))
	if fi.IsDir() {
		srcDir, srcEntry = local, "."
	}
	root, err := os.OpenRoot(srcDir)
	if err != nil {
		return err
	}
	defer root.Close()
	total := fi.Size()
	if fi.IsDir() {
		// The whole tree is checked before anything is sent: a refused
		// copy is refused before it starts.
		if total, err = checkLocalTree(local); err != nil {
			return fmt.Errorf("cp %s: %w", local, err)
		}
	}
	p := c.startProgress("copying to "+name+":"+dst, total)
	pr, pw := io.Pipe()
	packed := make(chan error, 1)
	go func() {
		var err error
		if fi.IsDir() {
			_, err = tree.Pack(root, srcEntry, pw, nil)
		} else {
			err = packFile(pw, root, srcEntry, entryName)
		}
		pw.CloseWithError(err)
		packed <- err
	}()
	res, err := svc.CopyIn(ctx, name, intoDir, p.reader(pr))
	pr.CloseWithError(errCopyEnded)
	perr := <-packed
	p.stop(err == nil)
	if errors.Is(perr, errCopyEnded) || errors.Is(perr, io.ErrClosedPipe) {
		perr = nil // the upload ended first; its error says why
	}
	switch {
	case perr != nil:
		return fmt.Errorf("cp %s: %w", local, perr) // the local side failed: that is why the upload did
	case err != nil:
		return err
	}
	to := intoDir
	if !fi.IsDir() {
		to = path.Join(intoDir, entryName)
	}
	c.copied(res, name+":"+to)
	return nil
}

// errCopyEnded stops the local side of an upload that ended.
var errCopyEnded = errors.New("the copy ended")

// packFile writes a one-file archive whose entry is called name.
func packFile(w io.Writer, root *os.Root, file, name string) error {
	f, err := root.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file or a directory", file)
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Format: tar.FormatPAX, Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("%s: %w (changed while copying?)", file, err)
	}
	return tw.Close()
}

// copyOut downloads NAME:src to a local path (or a tar on stdout).
func (c *Call) copyOut(ctx context.Context, svc session.Service, name, src, local string) error {
	rfi, err := svc.Stat(ctx, name, src)
	if err != nil {
		return err
	}
	rc, err := svc.CopyOut(ctx, name, src)
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		if _, err := io.Copy(c.env.Stdout, rc); err != nil {
			return fmt.Errorf("cp %s:%s: %w", name, src, err)
		}
		return nil
	}
	base := path.Base(path.Clean("/" + src))
	if base == "/" {
		base = "workspace"
	}
	lfi, lerr := os.Stat(local)
	if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
		return lerr
	}
	p := c.startProgress("copying from "+name+":"+src, -1)
	if rfi.IsDir() {
		target := local
		if lerr == nil && lfi.IsDir() {
			target = filepath.Join(local, base)
		}
		// Unpacked from the nearest directory that exists, so a target
		// (and parents) that did not is made only when the whole copy is
		// in: a refused copy leaves nothing under its name.
		above := filepath.Dir(filepath.Clean(target))
		for {
			if fi, err := os.Stat(above); err == nil && fi.IsDir() {
				break
			}
			if above == filepath.Dir(above) {
				break
			}
			above = filepath.Dir(above)
		}
		rel, err := filepath.Rel(above, filepath.Clean(target))
		if err != nil {
			return err
		}
		root, err := os.OpenRoot(above)
		if err != nil {
			return err
		}
		defer root.Close()
		res, err := unpackLocal(root, filepath.ToSlash(rel), p.reader(rc))
		p.stop(err == nil)
		if err != nil {
			return fmt.Errorf("cp %s:%s: %w", name, src, err)
		}
		c.copied(fromTree(res), target)
		return nil
	}
	// One file: unpacked in a fresh directory beside its destination,
	// then renamed into place, so nothing else there is touched.
	dest := local
	if lerr == nil && lfi.IsDir() {
		dest = filepath.Join(local, base)
	}
	stage, err := os.MkdirTemp(filepath.Dir(dest), ".berth-cp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	root, err := os.OpenRoot(stage)
	if err != nil {
		return err
	}
	defer root.Close()
	res, err := unpackLocal(root, ".", p.reader(rc))
	p.stop(err == nil)
	if err != nil {
		return fmt.Errorf("cp %s:%s: %w", name, src, err)
	}
	if res.Files != 1 || res.Entries != 1 {
		return fmt.Errorf("cp %s:%s: the session sent %d entries for one file", name, src, res.Entries)
	}
	if err := os.Rename(filepath.Join(stage, rfi.Name), dest); err != nil {
		return err
	}
	syncPath(filepath.Dir(dest))
	c.copied(fromTree(res), dest)
	return nil
}

func fromTree(r tree.Result) session.CopyResult {
	return session.CopyResult{Files: r.Files, Dirs: r.Dirs, Symlinks: r.Symlinks, Bytes: r.Bytes}
}

func syncPath(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

func (c *Call) copied(res session.CopyResult, to string) {
	dirs := "directories"
	if res.Dirs == 1 {
		dirs = "directory"
	}
	links := ""
	if res.Symlinks > 0 {
		links = ", " + plural(res.Symlinks, "symlink")
	}
	fmt.Fprintf(c.env.Stdout, "copied %s, %d %s%s (%s) to %s, durably\n",
		plural(res.Files, "file"), res.Dirs, dirs, links, session.FormatBytes(res.Bytes), to)
}

// checkLocalTree checks a local tree as the copy will (every symlink must
// point inside it) and returns the bytes of its regular files, for
// progress. The copy checks again as it packs: the tree may change.
func checkLocalTree(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile, or unreadable: packing says which
		}
		switch {
		case d.Type().IsRegular():
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(dir, p)
			if !tree.LinkInside(filepath.ToSlash(rel), target) {
				return fmt.Errorf("refusing symlink %s → %s: it points out of the tree being copied: %w", rel, target, tree.ErrEscape)
			}
		}
		return nil
	})
	return n, err
}

// unpackLocal unpacks r into dir of root durably, with a syncfs of the
// filesystem per batch rather than an fsync per file.
func unpackLocal(root *os.Root, dir string, r io.Reader) (tree.Result, error) {
	sync, done, err := tree.SyncFS(root)
	if err != nil {
		return tree.Result{}, err
	}
	defer done()
	return tree.Unpack(root, dir, r, tree.Options{Sync: sync})
}
