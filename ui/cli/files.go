package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"

	"github.com/berthvm/berth/session"
)

func filesCmd() *Command {
	return &Command{
		Name: "files", Action: session.ActionRead, Group: "Files", Usage: "NAME [PATH] [-l]", Args: []string{"NAME", "[PATH]"},
		Summary: "list files in a session's /workspace",
		Help:    "PATH is relative to /workspace or absolute under it; default /workspace itself.",
		Example: "berth files demo src -l",
		Setup: func(fs *flag.FlagSet) RunFunc {
			long := fs.Bool("l", false, "long listing: mode, size, modification time")
			return func(ctx context.Context, c *Call, args []string) error {
				p := ""
				if len(args) > 1 {
					p = args[1]
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				fi, err := svc.Stat(ctx, args[0], p)
				if err != nil {
					return err
				}
				list := []session.FileInfo{fi}
				if fi.IsDir() {
					if list, err = svc.ListDir(ctx, args[0], p); err != nil {
						return err
					}
				}
				sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
				if !*long {
					for _, f := range list {
						fmt.Fprintln(c.env.Stdout, displayName(f))
					}
					return nil
				}
				loc := c.env.Now().Location()
				t := newTable(c.env.Stdout, "MODE", "SIZE", "MODIFIED", "NAME")
				for _, f := range list {
					size := session.FormatBytes(f.Size)
					if f.IsDir() {
						size = "-"
					}
					t.row(f.Mode.String(), size, f.ModTime.In(loc).Format("2006-01-02 15:04"), displayName(f))
				}
				return t.flush()
			}
		},
	}
}

func displayName(f session.FileInfo) string {
	switch {
	case f.IsDir():
		return f.Name + "/"
	case f.Link != "":
		return f.Name + " -> " + f.Link
	}
	return f.Name
}

func catCmd() *Command {
	return &Command{
		Name: "cat", Action: session.ActionRead, Group: "Files", Usage: "NAME PATH", Args: []string{"NAME", "PATH"},
		Summary: "print a workspace file",
		Example: "berth cat demo notes.txt",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				rc, err := svc.ReadFile(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				defer rc.Close()
				if _, err := io.Copy(c.env.Stdout, rc); err != nil {
					return fmt.Errorf("cat %s: %w", args[1], err)
				}
				return nil
			}
		},
	}
}

// progressThreshold is the transfer size above which put and get show
// progress on a terminal.
const progressThreshold = 8 << 20

func putCmd() *Command {
	return &Command{
		Name: "put", Action: session.ActionWriteFile, Group: "Files", Usage: "NAME LOCAL [REMOTE] [--run ID]", Args: []string{"NAME", "LOCAL", "[REMOTE]"},
		Summary: "copy a local file into a session's /workspace, durably",
		Help: `Writes LOCAL ('-' for stdin) to REMOTE (default: LOCAL's base name; into it when it is a
directory). When put succeeds the file is durable: written to a temporary file, synced
and renamed into place. Progress goes to stderr for transfers over 8 MB.`,
		Example: "berth put demo ./data.csv input/data.csv\ntar c src | berth put demo - src.tar",
		Setup: func(fs *flag.FlagSet) RunFunc {
			run := runFlag(fs)
			return func(ctx context.Context, c *Call, args []string) error {
				ctx, err := inRun(ctx, *run)
				if err != nil {
					return err
				}
				name, local := args[0], args[1]
				var remote string
				if len(args) > 2 {
					remote = args[2]
				}
				if local == "-" && remote == "" {
					return usageErrorf("reading stdin needs a REMOTE path")
				}
				if local != "-" && c.env.NoLocalFiles {
					return usageErrorf("local files are not reachable here; use '-' to read stdin")
				}
				var src io.Reader = c.env.Stdin
				size := int64(-1)
				if local != "-" {
					f, err := os.Open(local)
					if err != nil {
						return fmt.Errorf("put: %w", err)
					}
					defer f.Close()
					fi, err := f.Stat()
					if err != nil {
						return fmt.Errorf("put: %w", err)
					}
					if fi.IsDir() {
						return fmt.Errorf("put: %s is a directory; put copies one file (try tar c %s | berth put %s - %s.tar)", local, local, name, filepath.Base(local))
					}
					src, size = f, fi.Size()
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				if remote == "" {
					remote = filepath.Base(local)
				} else if fi, err := svc.Stat(ctx, name, remote); err == nil && fi.IsDir() && local != "-" {
					remote = path.Join(remote, filepath.Base(local))
				}
				pr := c.startProgress("put "+remote, size)
				n, err := svc.WriteFile(ctx, name, remote, pr.reader(src))
				pr.stop(err == nil)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.env.Stdout, "wrote %d bytes (%s) to %s:%s, durably\n", n, session.FormatBytes(n), name, workspaceDisplay(remote))
				return nil
			}
		},
	}
}

// workspaceDisplay shows a workspace path as an absolute one.
func workspaceDisplay(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join("/workspace", p)
}

func getCmd() *Command {
	return &Command{
		Name: "get", Action: session.ActionRead, Group: "Files", Usage: "NAME REMOTE [LOCAL]", Args: []string{"NAME", "REMOTE", "[LOCAL]"},
		Summary: "copy a workspace file out of a session",
		Help: `Writes REMOTE to LOCAL ('-' for stdout; default: REMOTE's base name; into it when it is
a directory). LOCAL is replaced only once the whole file has arrived.`,
		Example: "berth get demo results/report.html\nberth get demo build.log - | less",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				name, remote := args[0], args[1]
				local := path.Base(workspaceDisplay(remote))
				if len(args) > 2 {
					local = args[2]
				}
				if local != "-" && c.env.NoLocalFiles {
					return usageErrorf("local files are not reachable here; use '-' to write to stdout")
				}
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				fi, err := svc.Stat(ctx, name, remote)
				if err != nil {
					return err
				}
				if fi.IsDir() {
					return fmt.Errorf("get: %s is a directory; get copies one file (try berth exec %s -- tar c %s > %s.tar)", workspaceDisplay(remote), name, remote, fi.Name)
				}
				rc, err := svc.ReadFile(ctx, name, remote)
				if err != nil {
					return err
				}
				defer rc.Close()
				pr := c.startProgress("get "+remote, fi.Size)
				if local == "-" {
					_, err := io.Copy(c.env.Stdout, pr.reader(rc))
					pr.stop(err == nil)
					if err != nil {
						return fmt.Errorf("get %s: %w", remote, err)
					}
					return nil
				}
				if st, err := os.Stat(local); err == nil && st.IsDir() {
					local = filepath.Join(local, fi.Name)
				}
				n, err := writeLocal(local, pr.reader(rc))
				pr.stop(err == nil)
				if err != nil {
					return fmt.Errorf("get %s: %w", remote, err)
				}
				fmt.Fprintf(c.env.Stdout, "wrote %d bytes (%s) to %s\n", n, session.FormatBytes(n), local)
				return nil
			}
		},
	}
}

// writeLocal writes r to a temporary file beside dst and renames it over
// dst once complete, so a failed transfer leaves dst as it was.
func writeLocal(dst string, r io.Reader) (n int64, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".berth-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if n, err = io.Copy(tmp, r); err != nil {
		return n, err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return n, err
	}
	if err = tmp.Sync(); err != nil {
		return n, err
	}
	if err = tmp.Close(); err != nil {
		return n, err
	}
	return n, os.Rename(tmp.Name(), dst)
}

func rmCmd() *Command {
	return &Command{
		Name: "rm", Action: session.ActionRemoveFile, Group: "Files", Usage: "NAME PATH [-r]", Args: []string{"NAME", "PATH"},
		Summary: "remove a workspace file (or, with -r, a directory tree)",
		Example: "berth rm demo build -r",
		Setup: func(fs *flag.FlagSet) RunFunc {
			recursive := fs.Bool("r", false, "remove a directory and everything in it")
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				fi, err := svc.Stat(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				if fi.IsDir() && !*recursive {
					return fmt.Errorf("rm: %s is a directory; add -r to remove it and everything in it", workspaceDisplay(args[1]))
				}
				return svc.Remove(ctx, args[0], args[1])
			}
		},
	}
}

func mkdirCmd() *Command {
	return &Command{
		Name: "mkdir", Action: session.ActionMkdir, Group: "Files", Usage: "NAME PATH", Args: []string{"NAME", "PATH"},
		Summary: "make a workspace directory and any missing parents",
		Example: "berth mkdir demo data/raw",
		Setup: func(fs *flag.FlagSet) RunFunc {
			return func(ctx context.Context, c *Call, args []string) error {
				svc, err := c.service(ctx)
				if err != nil {
					return err
				}
				return svc.Mkdir(ctx, args[0], args[1])
			}
		},
	}
}
