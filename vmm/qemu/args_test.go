package qemu

import (
	"strings"
	"testing"

	"github.com/berthvm/berth/vmm"
)

// A NIC is a stream netdev QEMU listens on (berth connects, and again
// after a daemon restart) at a fixed slot past the layers', and only when
// asked for.
func TestArgsNIC(t *testing.T) {
	for _, tc := range []struct {
		nic  bool
		mac  string
		want []string
	}{
		{false, "", nil},
		{true, "", []string{ // a session made before each NIC had its own MAC
			"-netdev stream,id=nic0,server=on,addr.type=unix,addr.path=nic.sock",
			"-device virtio-net-pci,netdev=nic0,id=nicdev,addr=0x1e,mac=52:54:00:12:34:56,host_mtu=65520",
		}},
		{true, "52:54:00:0a:0b:0c", []string{
			"-device virtio-net-pci,netdev=nic0,id=nicdev,addr=0x1e,mac=52:54:00:0a:0b:0c,host_mtu=65520",
		}},
	} {
		args := strings.Join(Args(vmm.Config{Dir: "/x/vm", Kernel: "k", Initramfs: "i", NIC: tc.nic, NICMAC: tc.mac}, vmm.AccelTCG), " ")
		for _, w := range tc.want {
			if !strings.Contains(args, w) {
				t.Errorf("NIC %v: args lack %q:\n%s", tc.nic, w, args)
			}
		}
		if !tc.nic && strings.Contains(args, "netdev") {
			t.Errorf("no NIC asked for, yet: %s", args)
		}
	}
	if 0x6+vmm.MaxLayers > 0x1e {
		t.Fatalf("the layers' slots reach the NIC's")
	}
}
