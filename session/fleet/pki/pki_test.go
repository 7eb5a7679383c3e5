package pki

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInitIssueEnsure(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	if err := Init(ca, "t"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(ca, CAKey)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, %v", fi, err)
	}
	if err := Init(ca, "t"); err == nil || !strings.Contains(err.Error(), "holds a fleet CA already") {
		t.Errorf("second init: %v", err)
	}
	out := filepath.Join(t.TempDir(), "h1")
	if err := Ensure(ca, out, "h1", nil, nil); err != nil {
		t.Fatal(err)
	}
	first, _ := os.ReadFile(filepath.Join(out, Cert))
	// A second Ensure keeps the certificate the CA signed.
	if err := Ensure(ca, out, "h1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(out, Cert)); !bytes.Equal(first, again) {
		t.Error("Ensure reissued a good certificate")
	}
	caCert, _, err := loadCA(ca, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(out, caCert); err != nil {
		t.Errorf("issued certificate does not verify: %v", err)
	}
	der, _ := readPEM(filepath.Join(out, Cert), "CERTIFICATE")
	c, _ := x509.ParseCertificate(der)
	if c.Subject.CommonName != "h1" || len(c.ExtKeyUsage) != 2 || c.IsCA {
		t.Errorf("issued %+v", c.Subject)
	}
	// One of another CA is replaced by one of this CA.
	other := filepath.Join(t.TempDir(), "other")
	if err := Init(other, "o"); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(ca, filepath.Join(t.TempDir(), "x"), "x", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(other, out, "h1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := verify(out, caCert); err == nil {
		t.Error("a certificate of the old CA kept after Ensure with another")
	}
	// Without the CA's key a missing certificate cannot be made.
	keyless := filepath.Join(t.TempDir(), "keyless")
	os.MkdirAll(keyless, 0o700)
	b, _ := os.ReadFile(filepath.Join(ca, CACert))
	os.WriteFile(filepath.Join(keyless, CACert), b, 0o644)
	if err := Ensure(keyless, filepath.Join(t.TempDir(), "h2"), "h2", nil, nil); err == nil || !strings.Contains(err.Error(), "no CA key") {
		t.Errorf("Ensure without a CA key: %v", err)
	}
	if _, err := ClientConfig(out); err != nil {
		t.Error(err)
	}
	if _, err := ClientConfig(t.TempDir()); err == nil {
		t.Error("ClientConfig of an empty directory")
	}
}
