package chfake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// Disks and PCI slots, as CH v53.0 handles them:
//
//   - A disk is opened read-write, or read-only with readonly:true, and
//     locked with an OFD lock: a write lock for a writable disk, a shared
//     read lock for a read-only one (virtio-devices/src/block.rs
//     try_lock_image), over the bytes [0, size) unless lock_granularity
//     is Full (block/src/io/fcntl.rs). So any number of VMs may hold an
//     image read-only, and none may write it meanwhile.
//   - Device ids are unique across the config ("Identifier X is not
//     unique"), and ids starting with "__" are CH's own.
//   - Every virtio device sits on its own slot of PCI segment 0 (slot 0 is
//     the root bridge): the slot it had in the snapshot being restored,
//     else its pci_device_id, else the lowest free one. Disks come first,
//     then the always-present virtio-rng, then the vsock device
//     (device_manager.rs make_virtio_devices).
//   - vm.add-disk checks the config with the disk added, then hot-plugs it
//     into a booted VM (200 with its PCI address) or, when the VM is
//     created but not booted, only adds it to the config (204). Either way
//     the disk joins the config, so a later vm.snapshot records it.

// pciSlots is the number of device ids on a PCI segment.
const pciSlots = 32

// Ids CH gives the devices berth does not name.
const (
	rngID   = "__rng"
	vsockID = "_vsock0"
)

// bdf is how CH writes a PCI address of segment 0, bus 0.
func bdf(slot uint8) string { return fmt.Sprintf("0000:00:%02x.0", slot) }

// allocate gives device id a PCI slot: want if set, else the lowest free.
func (d *devices) allocate(id string, want *uint8) (uint8, error) {
	used := map[uint8]bool{0: true}
	for _, s := range d.slots {
		used[s] = true
	}
	if want != nil {
		switch {
		case *want >= pciSlots:
			return 0, fmt.Errorf("Invalid PCI device identifier provided: %d", *want)
		case used[*want]:
			return 0, fmt.Errorf("Valid PCI device identifier but already used: %d", *want)
		}
		d.slots[id] = *want
		return *want, nil
	}
	for s := uint8(1); s < pciSlots; s++ {
		if !used[s] {
			d.slots[id] = s
			return s, nil
		}
	}
	return 0, fmt.Errorf("Could not find an available device slot on the PCI bus")
}

// slotFor is the slot device id should get: the one recorded in the
// snapshot being restored, else the one its config asks for.
func slotFor(restored map[string]uint8, id string, asked *uint8) *uint8 {
	if s, ok := restored[id]; ok {
		return &s
	}
	return asked
}

// deviceTree is vm.info's device_tree for the PCI devices: each virtio
// device and its virtio-pci transport, which holds the address.
func (d *devices) deviceTree() map[string]chapi.DeviceNode {
	tree := make(map[string]chapi.DeviceNode)
	for id, slot := range d.slots {
		pci, addr := "_virtio-pci-"+id, bdf(slot)
		tree[id] = chapi.DeviceNode{Id: &id}
		tree[pci] = chapi.DeviceNode{Id: &pci, Children: &[]string{id}, PciBdf: &addr}
	}
	return tree
}

// validateDisks is the part of CH's config validation that concerns
// disks: a path each, unique ids, and usable PCI device ids.
func validateDisks(disks []chapi.DiskConfig) []string {
	const what = "Failed to validate config"
	seen := make(map[string]bool)
	for _, dc := range disks {
		if dc.Path == nil {
			// CH also takes vhost-user disks, which have none; the fake
			// does not model them.
			return []string{what, "Disk path is missing"}
		}
		if dc.Id != nil {
			id := *dc.Id
			if strings.HasPrefix(id, "__") {
				return []string{what, fmt.Sprintf("Identifier %s is not invalid", id)}
			}
			if seen[id] {
				return []string{what, fmt.Sprintf("Identifier %s is not unique", id)}
			}
			seen[id] = true
		}
		if p := dc.PciDeviceId; p != nil {
			switch {
			case *p >= pciSlots:
				return []string{what, fmt.Sprintf("Given PCI device ID (%d) is out of the supported range of 0..%d", *p, pciSlots)}
			case *p == 0:
				return []string{what, "Given PCI device ID (0) is reserved"}
			}
		}
	}
	return nil
}

// openDisk opens and locks a disk image as CH does. On failure it
// returns CH's error chain from the device manager's error down, and
// whether the image was locked by someone else.
func openDisk(dc chapi.DiskConfig) (_ *os.File, msgs []string, locked bool) {
	path := *dc.Path
	ro := dc.Readonly != nil && *dc.Readonly
	flag, lt, name := os.O_RDWR, int16(unix.F_WRLCK), "Write"
	if ro {
		flag, lt, name = os.O_RDONLY, unix.F_RDLCK, "Read"
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, []string{"Cannot open disk path", err.Error()}, false
	}
	lk := unix.Flock_t{Type: lt, Whence: io.SeekStart}
	if dc.LockGranularity == nil || *dc.LockGranularity != chapi.Full {
		// byte-range, the default: [0, physical size) as of the open.
		if st, err := f.Stat(); err == nil {
			lk.Len = st.Size()
		}
	}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		return nil, []string{"Cannot lock images of all block devices",
			fmt.Sprintf("Failed to get %s lock for disk image: %s", name, path), "The file is already locked"}, true
	}
	return f, nil, false
}

// addDisk is vm.add-disk.
func (s *Server) addDisk(body []byte) (any, *apiError) {
	const what = "The disk could not be added to the VM"
	var dc chapi.DiskConfig
	if err := json.Unmarshal(body, &dc); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msgs: []string{"Failed to deserialize JSON", err.Error()}}
	}
	s.mu.Lock()
	cfg, dev := s.config, s.dev
	s.mu.Unlock()
	if cfg == nil {
		return nil, errAPI(http.StatusNotFound, what, "VM is not created")
	}
	var disks []chapi.DiskConfig
	if cfg.Disks != nil {
		disks = slices.Clone(*cfg.Disks)
	}
	if msgs := validateDisks(append(disks, dc)); msgs != nil {
		return nil, errAPI(http.StatusInternalServerError, append([]string{what}, msgs...)...)
	}
	if dev == nil {
		// Created, not booted: a cold add, into the config only.
		s.appendDisk(dev, dc)
		s.logf("disk added to the VM config (cold)")
		return nil, nil
	}
	fail := func(msgs ...string) (any, *apiError) {
		return nil, errAPI(http.StatusInternalServerError, append([]string{what, "Error from device manager"}, msgs...)...)
	}
	if dc.Id == nil {
		id := fmt.Sprintf("_disk%d", len(disks))
		dc.Id = &id
	}
	f, msgs, _ := openDisk(dc)
	if msgs != nil {
		return fail(msgs...)
	}
	s.mu.Lock()
	slot, err := dev.allocate(*dc.Id, dc.PciDeviceId)
	if err == nil {
		dev.disks = append(dev.disks, f)
	}
	s.mu.Unlock()
	if err != nil {
		f.Close()
		return fail("Failed to find an available PCI device ID", err.Error())
	}
	if !s.appendDisk(dev, dc) {
		// The VM went away meanwhile (a guest poweroff).
		f.Close()
		return nil, notRunning(what)
	}
	s.logf("disk %s hot-plugged at %s", *dc.Id, bdf(slot))
	return chapi.PciDeviceInfo{Id: *dc.Id, Bdf: bdf(slot)}, nil
}

// appendDisk adds dc to the VM's config, typed and as vm.info and
// vm.snapshot give it back, if the VM still has devices dev. It reports
// whether it did.
func (s *Server) appendDisk(dev *devices, dc chapi.DiskConfig) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.config == nil || s.dev != dev {
		return false
	}
	cfg := *s.config
	var disks []chapi.DiskConfig
	if cfg.Disks != nil {
		disks = slices.Clone(*cfg.Disks)
	}
	disks = append(disks, dc)
	cfg.Disks = &disks
	s.config = &cfg

	// The raw config keeps every field it was given, so it is patched
	// rather than re-encoded from the typed one.
	var raw map[string]any
	dec := json.NewDecoder(bytes.NewReader(s.rawConfig))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil || raw == nil {
		raw = make(map[string]any)
	}
	b, _ := json.Marshal(dc)
	var disk any
	dec = json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	dec.Decode(&disk)
	list, _ := raw["disks"].([]any)
	raw["disks"] = append(list, disk)
	s.rawConfig, _ = json.Marshal(raw)
	return true
}

// chfakeState is what the fake writes as a snapshot's state.json: CH
// writes CPU and device state there; the fake keeps the PCI slots, which
// a restore gives every device back by id.
type chfakeState struct {
	Chfake bool             `json:"chfake"`
	Slots  map[string]uint8 `json:"pci_slots,omitempty"`
}
