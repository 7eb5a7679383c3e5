package sshd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenSSHSCPOverSFTP: scp's default (SFTP) protocol both ways, with
// -p, on a file larger than one read or write.
func TestOpenSSHSCPOverSFTP(t *testing.T) {
	needBinary(t, "scp")
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	o := newOpenSSH(t, w, op)
	data := make([]byte, 5<<20)
	rand.Read(data)
	local := filepath.Join(o.dir, "f.bin")
	os.WriteFile(local, data, 0o640)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scp := func(args ...string) {
		t.Helper()
		cmd := o.command(ctx, "scp", append(append(o.opts(), "-P", o.port, "-s"), args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("scp %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	scp("-p", local, "demo@127.0.0.1:up.bin")
	if got := w.readFile("demo", "up.bin"); got != string(data) {
		t.Fatalf("uploaded %d bytes, want %d", len(got), len(data))
	}
	if fi, err := w.fake.Stat(context.Background(), "demo", "up.bin"); err != nil || fi.Mode.Perm() != 0o640 {
		t.Errorf("scp -p: the upload's mode is %v (%v), want 0640", fi.Mode, err)
	}
	back := filepath.Join(o.dir, "back.bin")
	scp("demo@127.0.0.1:up.bin", back)
	if b, _ := os.ReadFile(back); !bytes.Equal(b, data) {
		t.Fatalf("downloaded %d bytes, want %d", len(b), len(data))
	}
}

// TestSSHFS mounts a session with sshfs and works on it as a developer's
// tools do.
func TestSSHFS(t *testing.T) {
	needBinary(t, "sshfs", "fusermount")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	op := newKey(t, "op@openssh", Operator)
	w := newWorld(t, worldOpts{}, op)
	w.create("demo")
	o := newOpenSSH(t, w, op)
	mnt := t.TempDir()
	args := []string{"demo@127.0.0.1:/workspace", mnt, "-p", o.port, "-o", "IdentityFile=" + o.key,
		"-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=" + o.knownHosts,
		"-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "cache=no"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := o.command(ctx, "sshfs", args...).CombinedOutput(); err != nil {
		t.Fatalf("sshfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("fusermount", "-u", "-z", mnt).Run() })
	d := filepath.Join(mnt, "fs")
	sh := func(script string) {
		t.Helper()
		c := exec.CommandContext(ctx, "sh", "-c", script)
		c.Dir = d
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	sh("echo hello > f && [ \"$(cat f)\" = hello ]")
	sh("dd if=/dev/urandom of=big bs=1M count=8 2>/dev/null && [ $(stat -c %s big) = 8388608 ]")
	sh("printf XYZ | dd of=big bs=1 seek=1000 conv=notrunc 2>/dev/null && [ \"$(dd if=big bs=1 skip=1000 count=3 2>/dev/null)\" = XYZ ]")
	sh("echo more >> f && [ \"$(cat f)\" = \"$(printf 'hello\\nmore')\" ]")
	sh("truncate -s 3 f && [ \"$(cat f)\" = hel ] && truncate -s 10 f && [ $(stat -c %s f) = 10 ]")
	sh("echo new > g && mv g f && [ \"$(cat f)\" = new ]")
	sh("ln -s f link && [ \"$(readlink link)\" = f ] && [ \"$(cat link)\" = new ]")
	ref := t.TempDir()
	for _, root := range []string{d, ref} {
		rng := mrand.New(mrand.NewPCG(7, 9))
		buf := make([]byte, 64<<10)
		for i := 0; i < 200; i++ {
			p := filepath.Join(root, fmt.Sprintf("w%d", rng.IntN(12)))
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			n := 1 + rng.IntN(len(buf))
			for j := range buf[:n] {
				buf[j] = byte(rng.Uint32())
			}
			switch rng.IntN(4) {
			case 0:
				f.Truncate(int64(rng.IntN(200 << 10)))
			default:
				if _, err := f.WriteAt(buf[:n], int64(rng.IntN(256<<10))); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()
		}
	}
	for i := 0; i < 12; i++ {
		got, gerr := os.ReadFile(filepath.Join(d, fmt.Sprintf("w%d", i)))
		want, werr := os.ReadFile(filepath.Join(ref, fmt.Sprintf("w%d", i)))
		if (gerr != nil) != (werr != nil) || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Errorf("w%d on sshfs: %d bytes (%v), want %d (%v)", i, len(got), gerr, len(want), werr)
		}
	}
}
