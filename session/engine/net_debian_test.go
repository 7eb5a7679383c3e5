package engine_test

import (
	"archive/zip"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// testTLS makes a CA and a server certificate for host.berth.internal and
// pkgs.test signed by it; it returns the CA's PEM.
func testTLS(t *testing.T) (tls.Certificate, []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "berth test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "host.berth.internal"},
		DNSNames:  []string{"host.berth.internal", "pkgs.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// testWheel builds berthprobe-1.0-py3-none-any.whl.
func testWheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"berthprobe/__init__.py", "VALUE = 'from the host index'\n"},
		{"berthprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: berthprobe\nVersion: 1.0\n"},
		{"berthprobe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: berth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, _ := z.Create(f.name)
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("berthprobe-1.0.dist-info/RECORD,,\n")
	w, _ := z.Create("berthprobe-1.0.dist-info/RECORD")
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Egress from a Debian guest with the tools agents use (curl, wget,
// python's urllib, pip) to host-side servers on loopback, and a forward to
// python's http.server on the guest's loopback.
func TestNetDebian(t *testing.T) {
	e := newDebianEnv(t)
	cert, caPEM := testTLS(t)
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls says %s", r.URL.Path)
	}))
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	wheel := testWheel(t)
	index := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/berthprobe/":
			fmt.Fprint(w, `<html><body><a href="/files/berthprobe-1.0-py3-none-any.whl">berthprobe-1.0-py3-none-any.whl</a></body></html>`)
		case "/files/berthprobe-1.0-py3-none-any.whl":
			w.Write(wheel)
		default:
			http.NotFound(w, r)
		}
	}))
	defer index.Close()
	tp := strconv.Itoa(tlsSrv.Listener.Addr().(*net.TCPAddr).Port)
	ip := strconv.Itoa(index.Listener.Addr().(*net.TCPAddr).Port)
	t.Setenv("BERTH_TEST_HOSTS", testHosts)
	e.StartDaemon()
	policy := "allow:host.berth.internal:" + tp + ",host.berth.internal:" + ip
	e.OK("create", "deb", "--image", "debian", "--disk", "256M", "--net", policy)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, caPEM, 0o644)
	e.OK("put", "deb", ca, "ca.pem")
	allowed := "https://host.berth.internal:" + tp + "/ok"
	denied := "https://pkgs.test:" + tp + "/no"
	deniedMsg := "berth: egress to pkgs.test:" + tp + " is not allowed for session deb (policy: " + policy + ")"

	e.Subtest(t, "curl, wget and urllib reach an allowed HTTPS server through the proxy", func(t *testing.T) {
		for _, argv := range [][]string{
			{"curl", "-sS", "--cacert", "/workspace/ca.pem", allowed},
			{"wget", "-q", "-O-", "--ca-certificate=/workspace/ca.pem", allowed},
			{"python3", "-c", "import ssl, urllib.request; print(urllib.request.urlopen('" + allowed + "', context=ssl.create_default_context(cafile='/workspace/ca.pem')).read().decode(), end='')"},
		} {
			if out := e.OK(append([]string{"exec", "deb", "--"}, argv...)...); out != "tls says /ok" {
				t.Errorf("%s: %q", argv[0], out)
			}
		}
	})

	e.Subtest(t, "denied entries are refused with the message", func(t *testing.T) {
		for _, argv := range [][]string{
			{"sh", "-c", "curl -sS -v --cacert /workspace/ca.pem " + denied + " 2>&1"},
			{"sh", "-c", "wget -O- --ca-certificate=/workspace/ca.pem " + denied + " 2>&1"},
			{"sh", "-c", "python3 -c \"import urllib.request; urllib.request.urlopen('" + denied + "')\" 2>&1"},
		} {
			r := e.Run(append([]string{"exec", "deb", "--"}, argv...)...)
			if r.Code == 0 || !strings.Contains(r.Stdout, deniedMsg) {
				t.Errorf("%s: exit %d, output:\n%s\nwant a failure showing %q", argv[2], r.Code, r.Stdout, deniedMsg)
			}
		}
	})

	e.Subtest(t, "pip install of a wheel from an index on host loopback", func(t *testing.T) {
		out := e.OK("exec", "deb", "--", "sh", "-c", "pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages --target /workspace/pp "+
			"--index-url http://host.berth.internal:"+ip+"/simple/ --trusted-host host.berth.internal berthprobe 2>&1 && "+
			"PYTHONPATH=/workspace/pp python3 -c 'import berthprobe; print(berthprobe.VALUE)'")
		if !strings.Contains(out, "from the host index") {
			t.Errorf("pip install:\n%s", out)
		}
	})

	e.Subtest(t, "port-forward to python's http.server bound to 127.0.0.1", func(t *testing.T) {
		e.OK("exec", "deb", "--", "sh", "-c", "echo served > /workspace/page.txt; cd /workspace && (setsid python3 -m http.server 8000 --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &)")
		deadline := time.Now().Add(60 * time.Second)
		for {
			var st session.NetStatus
			json.Unmarshal([]byte(e.OK("net", "deb", "--json")), &st)
			up := false
			for _, p := range st.Listening {
				up = up || p.Port == 8000
			}
			if up {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("http.server is not listening: %+v", st)
			}
			time.Sleep(200 * time.Millisecond)
		}
		fw := e.portForward("deb", fmt.Sprintf("%d:8000", freePort(t)))
		if body, err := httpGet(t, "http://"+fw.addrs[0]+"/page.txt"); err != nil || body != "served\n" {
			t.Errorf("GET through the forward: %q %v", body, err)
		}
	})
}

// A recipe's setup steps get the network its net policy allows, and
// nothing else.
func TestRecipeNet(t *testing.T) {
	e := newDebianEnv(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "fetched by a setup step")
	}))
	defer up.Close()
	p := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	e.StartDaemon()
	dir := t.TempDir()
	recipe := filepath.Join(dir, "netty.toml")
	os.WriteFile(recipe, []byte(`name = "netty"
base = "debian"
net = "allow:host.berth.internal:`+p+`"
run = ["curl -sSf http://host.berth.internal:`+p+`/x > /etc/from-host",
       "if curl -sSf http://host.berth.internal:1/ 2>/etc/refused; then exit 1; fi"]
`), 0o644)
	e.OK("image", "build", "--recipe", recipe)
	e.OK("create", "nt", "--image", "netty", "--disk", "64M")
	if got := e.OK("exec", "nt", "--", "cat", "/etc/from-host", "/etc/refused"); !strings.Contains(got, "fetched by a setup step") || !strings.Contains(got, "403") {
		t.Errorf("the image holds %q", got)
	}
	if s := e.Info("nt"); s.Net != "none" {
		t.Errorf("a session of the image has net %q: the recipe's policy is the build's, not the sessions'", s.Net)
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("name = \"bad\"\nbase = \"debian\"\nnet = \"allow:\"\nrun = [\"true\"]\n"), 0o644)
	e.Fails("at least one entry", "image", "build", "--recipe", bad)
}
