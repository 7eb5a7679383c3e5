package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unicode"
)

// readLayerFile copies a file out of a layer's ext4 image with debugfs,
// which reads the image without mounting it, up to max bytes.
func readLayerFile(ctx context.Context, img, p string, dst io.Writer, max int64) error {
	for _, r := range p {
		// debugfs parses its request: a name it cannot be given
		// quoted is not read.
		if r == '"' || r == '\\' || !unicode.IsPrint(r) {
			return fmt.Errorf("%q cannot be read from a layer by debugfs", clip(p))
		}
	}
	cmd := exec.CommandContext(ctx, "debugfs", "-R", `cat "`+p+`"`, img)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
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
	n, cerr := io.Copy(dst, io.LimitReader(out, max+1))
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	switch {
	case cerr != nil:
		return cerr
	case werr != nil:
		return fmt.Errorf("debugfs %s: %w: %s", img, werr, lastLine(stderr.String()))
	case n > max:
		return fmt.Errorf("%s is over %d bytes", clip(p), max)
	}
	// debugfs says "File not found by ext2_lookup" on stderr and exits 0.
	if s := stderr.String(); strings.Contains(s, "not found") || strings.Contains(s, "Ext2 ") {
		return fmt.Errorf("read %s from %s: %s", clip(p), img, lastLine(s))
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	return clip(l)
}
