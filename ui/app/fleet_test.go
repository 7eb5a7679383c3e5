package app

import (
	"bytes"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

func TestWriteHosts(t *testing.T) {
	at := time.Date(2026, 12, 2, 17, 40, 1, 0, time.UTC)
	list := session.HostList{Fleet: true, Self: "a", Hosts: []session.HostInfo{
		{ID: "a", Addr: "127.0.0.1:7001", State: session.HostReady, CPUs: 8, MemoryMiB: 16384, DiskFree: 50 << 30,
			Images: []string{"mini", "debian"}, Used: session.HostUse{CPUs: 3, MemoryMiB: 1536, Sessions: 2}, Since: at},
		{ID: "b", State: session.HostDraining, CPUs: 2, MemoryMiB: 2048, Since: at},
		{ID: "c", Addr: "127.0.0.1:7003", State: session.HostGone, CPUs: 4, MemoryMiB: 4096, Since: at},
		{ID: "d", State: session.HostGone, Left: true, Since: at},
	}}
	var b bytes.Buffer
	if err := writeHosts(&b, list, time.UTC); err != nil {
		t.Fatal(err)
	}
	want := `HOST      STATE     ADDRESS         CPUS  MEMORY    DISK FREE  SESSIONS  IMAGES       SINCE                NOTE
a (this)  ready     127.0.0.1:7001  3/8   1.5G/16G  50G        2         mini,debian  2026-12-02 17:40:01  -
b         draining  -               0/2   0/2.0G    0          0         -            2026-12-02 17:40:01  -
c         gone      127.0.0.1:7003  0/4   0/4.0G    0          0         -            2026-12-02 17:40:01  lease expired
d         gone      -               0/0   0/0       0          0         -            2026-12-02 17:40:01  left
`
	if b.String() != want {
		t.Errorf("host ls table:\n%s\nwant:\n%s", b.String(), want)
	}
}
