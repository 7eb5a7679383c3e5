package sshd

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"
)

// LoadHostKey returns the ed25519 host key at dir/host_ed25519, generating
// it (mode 0600, with a .pub next to it) the first time. created reports a
// new key. A key file others can read is refused, as OpenSSH does.
func LoadHostKey(dir string) (signer gossh.Signer, created bool, err error) {
	path := filepath.Join(dir, HostKeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		signer, err = generateHostKey(dir, path)
		return signer, err == nil, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("SSH host key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, false, fmt.Errorf("SSH host key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, false, fmt.Errorf("SSH host key %s is readable by others (mode %04o): run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	signer, err = gossh.ParsePrivateKey(b)
	if err != nil {
		return nil, false, fmt.Errorf("SSH host key %s: %v (move it away to generate a new key; clients will then see a new fingerprint)", path, err)
	}
	return signer, false, nil
}

// generateHostKey writes a new key atomically: a crash leaves either no
// key or a whole one.
func generateHostKey(dir, path string) (gossh.Signer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("SSH host key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("SSH host key: generating: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "berth host key")
	if err != nil {
		return nil, fmt.Errorf("SSH host key: %w", err)
	}
	signer, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("SSH host key: %w", err)
	}
	if err := writeFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("SSH host key: %w", err)
	}
	pub := gossh.MarshalAuthorizedKey(signer.PublicKey())
	if err := writeFileAtomic(path+".pub", pub, 0o644); err != nil {
		return nil, fmt.Errorf("SSH host key: %w", err)
	}
	return signer, nil
}

// writeFileAtomic writes data to a temporary file, syncs it and renames it
// over path, then syncs the directory.
func writeFileAtomic(path string, data []byte, mode os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(mode); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
