package app

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// logFile is the daemon's log when it runs in the background: a file that
// is rotated when it grows past max (FILE.1 … FILE.keep kept), and that is
// also the process's stderr (fd 2), so what the runtime itself writes — a
// SIGQUIT's goroutine dump, a panic — lands in the current file.
type logFile struct {
	path string
	max  int64
	keep int

	mu   sync.Mutex
	f    *os.File
	size int64
}

func openLogFile(path string, max int64, keep int) (*logFile, error) {
	l := &logFile{path: path, max: max, keep: keep}
	if err := l.open(); err != nil {
		return nil, err
	}
	if l.size >= max {
		if err := l.rotate(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (l *logFile) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open the daemon log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	if err := unix.Dup2(int(f.Fd()), 2); err != nil {
		f.Close()
		return fmt.Errorf("make %s the daemon's stderr: %w", l.path, err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.size = f, st.Size()
	return nil
}

// rotate shifts FILE.i to FILE.i+1 (dropping the oldest), FILE to FILE.1,
// and opens a fresh FILE.
func (l *logFile) rotate() error {
	for i := l.keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1))
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate the daemon log: %w", err)
	}
	return l.open()
}

// Write appends p, rotating first when p would take the file past max. A
// failed rotation keeps writing to the current file.
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		l.rotate()
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
