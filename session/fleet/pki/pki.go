// Package pki is a fleet's certificate authority: `berth fleet init`
// makes one, and each host and etcd member gets a certificate from it,
// good both as server and as client, so that every connection between
// them is mutual TLS (each side proves it holds a certificate of the
// fleet's CA).
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The files of a CA directory, and of an issued certificate's.
const (
	CACert = "ca.crt"
	CAKey  = "ca.key"
	Cert   = "tls.crt"
	Key    = "tls.key"
)

// Lifetimes: the CA's, and an issued certificate's.
const (
	caLife   = 10 * 365 * 24 * time.Hour
	certLife = 2 * 365 * 24 * time.Hour
)

// maxPEM bounds a certificate or key file read back.
const maxPEM = 64 << 10

// Init makes a fleet CA in dir (created 0700): ca.crt, and ca.key
// (0600). A directory that holds a CA already is refused: a second CA
// would split the fleet.
func Init(dir, name string) error {
	if _, err := os.Stat(filepath.Join(dir, CAKey)); err == nil {
		return fmt.Errorf("%s holds a fleet CA already (%s): use it, or another directory", dir, CAKey)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("fleet CA directory: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "berth fleet CA " + name, Organization: []string{"berth"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caLife),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("make the fleet CA: %w", err)
	}
	return writePair(dir, CACert, CAKey, der, key)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePair(dir, certName, keyName string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, keyName), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyName, err)
	}
	if err := os.WriteFile(filepath.Join(dir, certName), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", certName, err)
	}
	return nil
}

func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEM {
		return nil, fmt.Errorf("%s: %d bytes, over %d", path, len(b), maxPEM)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, fmt.Errorf("%s: no %s PEM block", path, typ)
	}
	return blk.Bytes, nil
}

// loadCA reads the CA's certificate, and its key when with is set.
func loadCA(dir string, with bool) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	der, err := readPEM(filepath.Join(dir, CACert), "CERTIFICATE")
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA in %s: %w (berth fleet init --dir DIR makes one)", dir, err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil || !ca.IsCA {
		return nil, nil, fmt.Errorf("fleet CA in %s: %s is not a CA certificate", dir, CACert)
	}
	if !with {
		return ca, nil, nil
	}
	kder, err := readPEM(filepath.Join(dir, CAKey), "EC PRIVATE KEY")
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kder)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA key in %s: %w", dir, err)
	}
	return ca, key, nil
}

// Issue makes a certificate for name (a host id or member name) signed
// by the CA in caDir, valid for the DNS names and IPs given (and
// loopback), for server and client use, into out (ca.crt copied beside
// it, so out alone is enough afterwards).
func Issue(caDir, out, name string, dns []string, ips []net.IP) error {
	ca, caKey, err := loadCA(caDir, true)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name, Organization: []string{"berth"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLife),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    append([]string{name, "localhost"}, dns...),
		IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, ips...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("issue a certificate for %s: %w", name, err)
	}
	if err := writePair(out, Cert, Key, der, key); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, CACert), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o644)
}

// Ensure issues name's certificate into out from the CA in caDir unless
// out has one already that the CA signed; with no CA key in caDir (a
// host given only ca.crt), out's certificate must exist.
func Ensure(caDir, out, name string, dns []string, ips []net.IP) error {
	if _, err := Load(out); err == nil {
		ca, _, err := loadCA(caDir, false)
		if err == nil && verify(out, ca) == nil {
			return nil
		}
	}
	if _, err := os.Stat(filepath.Join(caDir, CAKey)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no certificate for %s in %s, and %s has no CA key to issue one: issue it where the CA key is (berth fleet cert --dir CA --name NAME --out DIR) or give the CA directory", name, out, caDir)
	}
	return Issue(caDir, out, name, dns, ips)
}

func verify(out string, ca *x509.Certificate) error {
	der, err := readPEM(filepath.Join(out, Cert), "CERTIFICATE")
	if err != nil {
		return err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	_, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// Files are the paths of an issued certificate, its key and the CA.
type Files struct{ Cert, Key, CA string }

// Load checks dir holds an issued certificate, its key and the CA
// certificate, and returns their paths.
func Load(dir string) (Files, error) {
	f := Files{Cert: filepath.Join(dir, Cert), Key: filepath.Join(dir, Key), CA: filepath.Join(dir, CACert)}
	if _, err := tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
		return f, fmt.Errorf("certificate in %s: %w", dir, err)
	}
	if _, _, err := loadCA(dir, false); err != nil {
		return f, err
	}
	return f, nil
}

// ClientConfig is a mutual-TLS client configuration from an issued
// certificate's directory: it presents the certificate and trusts only
// the fleet's CA.
func ClientConfig(dir string) (*tls.Config, error) {
	f, err := Load(dir)
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	ca, _, err := loadCA(dir, false)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}

// ServerConfig is a mutual-TLS server configuration from an issued
// certificate's directory: it presents the certificate and admits only
// clients that present one of the fleet's CA (hosts and operators'
// client certificates alike).
func ServerConfig(dir string) (*tls.Config, error) {
	cfg, err := ClientConfig(dir)
	if err != nil {
		return nil, err
	}
	cfg.ClientCAs, cfg.RootCAs = cfg.RootCAs, nil
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	return cfg, nil
}
