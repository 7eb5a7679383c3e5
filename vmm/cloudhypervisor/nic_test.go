package cloudhypervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
)

// frameOf is an Ethernet frame from src to the broadcast address carrying
// payload (an experimental ethertype: nothing in the namespace takes it).
func frameOf(src byte, payload string) []byte {
	f := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0, 0, src, 0x88, 0xb5}
	return append(f, payload...)
}

// roundTrip sends f through the NIC's stream and reads frames until it
// comes back (the fake guest echoes each frame) or the deadline passes.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, f []byte) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f)))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(f); err != nil {
		t.Fatal(err)
	}
	for {
		var n [4]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			t.Fatalf("waiting for the frame back: %v", err)
		}
		got := make([]byte, binary.BigEndian.Uint32(n[:]))
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatal(err)
		}
		// virtio's header (IFF_VNET_HDR) is the guest side's: the stream
		// carries bare frames.
		if bytes.Equal(got, f) {
			return
		}
	}
}

// A guest NIC on cloud-hypervisor: a tap in the VMM's own network
// namespace, opened by CH by name, its frames carried length-first as
// QEMU's stream netdev carries them.
func TestNIC(t *testing.T) {
	if !canMakeNetns() {
		t.Skip("a guest NIC on cloud-hypervisor needs CAP_SYS_ADMIN and CAP_NET_ADMIN (run the tests as root)")
	}
	d := newTestDriver(t, fakeBinary(t), nil)
	if !d.StartsNIC() {
		t.Fatal("StartsNIC = false as root")
	}
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.NIC, cfg.NICMAC = true, "52:54:00:0a:0b:0c" // the session's own
	v := startVM(t, d, cfg)

	c := vmInfo(t, v).Config
	if c.Net == nil || len(*c.Net) != 1 {
		t.Fatalf("net = %+v, want one NIC", c.Net)
	}
	n := (*c.Net)[0]
	if *n.Tap != tapName || *n.Mac != cfg.NICMAC || *n.Mtu != guest.NICMTU || *n.OffloadTso || *n.OffloadCsum || *n.OffloadUfo {
		t.Errorf("net config = tap %s mac %s mtu %d, offloads tso %v csum %v ufo %v", *n.Tap, *n.Mac, *n.Mtu, *n.OffloadTso, *n.OffloadCsum, *n.OffloadUfo)
	}
	// The VMM is in a namespace of its own: the host's has no berth0.
	if self, _ := os.Readlink("/proc/self/ns/net"); true {
		if its, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(v.Pid()), "ns/net")); its == self || its == "" {
			t.Fatalf("the VMM's network namespace %q is berth's own %q", its, self)
		}
	}
	if _, err := net.InterfaceByName(tapName); err == nil {
		t.Fatalf("%s is on the host's network", tapName)
	}
	if !v.HasNIC() {
		t.Fatal("HasNIC = false")
	}

	conn, err := v.DialNIC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	roundTrip(t, conn, r, frameOf(1, "small"))
	roundTrip(t, conn, r, frameOf(2, string(bytes.Repeat([]byte("x"), 60000)))) // the MTU is 65520
	conn.Close()

	// Attach (a daemon restarted) finds the NIC and dials it again.
	a, err := d.Attach(ctx, cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	av := a.(*VM)
	if !av.HasNIC() {
		t.Fatal("HasNIC after Attach = false")
	}
	conn, err = av.DialNIC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, conn, bufio.NewReader(conn), frameOf(3, "again"))

	// A snapshot restored in another VM's namespace finds its tap there.
	if err := v.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap")
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := v.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// The VM's end ends the stream.
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("the stream after the VM's end: %v, want EOF", err)
	}
	conn.Close()
	other := testConfig(t)
	other.Workspace = cfg.Workspace
	other.Incoming, other.NIC = snap, true
	v2 := startVM(t, d, other)
	conn, err = v2.DialNIC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn, bufio.NewReader(conn), frameOf(4, "restored"))

	// A VM without a NIC says so.
	plain := startVM(t, d, testConfig(t))
	if plain.HasNIC() {
		t.Error("HasNIC of a VM started without one")
	}
	if _, err := plain.DialNIC(ctx); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DialNIC without a NIC = %v, want fs.ErrNotExist", err)
	}
}
