package image

import (
	"fmt"
	"io"
	"io/fs"
	"syscall"
)

// cpioWriter writes the SVR4 "newc" format the kernel unpacks as an
// initramfs. Timestamps and owners are fixed so that the same inputs give
// the same bytes.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	n   int64
	err error
}

func (c *cpioWriter) header(name string, mode uint32, size int64) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
}

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	c.header(name, syscall.S_IFDIR|uint32(perm.Perm()), 0)
}

// File adds a regular file with the given content.
func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.header(name, syscall.S_IFREG|uint32(perm.Perm()), int64(len(data)))
	c.write(data)
	c.pad()
}

// Symlink adds a symbolic link.
func (c *cpioWriter) Symlink(name, target string) {
	c.header(name, syscall.S_IFLNK|0o777, int64(len(target)))
	c.write([]byte(target))
	c.pad()
}

// Close writes the trailer.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0)
	return c.err
}
