package agent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/guest"
)

// Forks. A VM restored from another session's memory snapshot is, until
// told otherwise, that session: same hostname, machine id, RNG state, boot
// id and filesystem UUIDs. fork makes it a machine of its own, before the
// host lets anything else happen in it (the firecracker "random for
// clones" recipe: entropy added and the CRNG reseeded, random-seed
// dropped, boot_id replaced).

// ext4's EXT4_IOC_SETFSUUID: _IOW('f', 44, struct fsuuid) with the 8-byte
// header struct fsuuid {u32 len; u32 flags; u8 uuid[]} (Linux 6.0+; with
// metadata_csum it needs metadata_csum_seed).
const ext4SetFSUUID = 0x4008662c

// bootIDFile holds the fork's boot id, bind-mounted over the kernel's.
const bootIDFile = "/run/berth-boot_id"

func (a *Agent) fork(req *guest.Request) (guest.ForkResult, error) {
	var res guest.ForkResult
	spec := guest.MountSpec{}
	if req.Mount != nil {
		spec = *req.Mount
	}
	// The snapshot was taken with the disks frozen; nothing below can
	// write until they are thawed.
	if err := a.thaw(); err != nil {
		return res, err
	}
	if err := a.setTime(req.Time, nil); err != nil {
		return res, err
	}
	if a.cfg.PID1 {
		if err := reseed(req.Data); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		os.Remove("/var/lib/systemd/random-seed")
		if id, err := newBootID(); err != nil {
			res.Errors = append(res.Errors, err.Error())
		} else {
			res.BootID = id
		}
		if err := SetIdentity(spec.Hostname, spec.MachineID); err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		// The source's open connections were cut with its stack; the
		// fork's NIC takes its own MAC and address.
		if spec.NICMAC != "" {
			if err := SetNICMAC(spec.NICMAC); err != nil {
				res.Errors = append(res.Errors, err.Error())
			}
			if err := SetupNet(); err != nil {
				res.Errors = append(res.Errors, err.Error())
			}
		}
	}
	if spec.Hostname != "" {
		a.mu.Lock()
		a.host = spec.Hostname
		a.mu.Unlock()
	}
	if spec.Workspace != "" {
		if root, err := a.workspace(); err == nil {
			if d, err := root.Open("."); err == nil {
				err = setFSUUID(d, spec.Workspace)
				d.Close()
				if err == nil {
					res.WorkspaceUUID = true
					a.mu.Lock()
					a.ws.UUID = spec.Workspace
					a.mu.Unlock()
				} else {
					res.Errors = append(res.Errors, "workspace: "+err.Error())
				}
			}
		}
	}
	if sys := a.system(); sys != nil && spec.System != "" {
		if err := setFSUUID(sys, spec.System); err == nil {
			res.SystemUUID = true
			a.mu.Lock()
			a.sysInfo.UUID = spec.System
			a.mu.Unlock()
		} else {
			res.Errors = append(res.Errors, "system disk: "+err.Error())
		}
	}
	// The source's executions are the source's records: here they keep
	// running as processes, their output drained.
	for _, e := range a.execs.list() {
		if a.execs.forget(e.ID) == nil && e.Running {
			res.Inherited++
		}
	}
	return res, nil
}

// reseed mixes seed into the kernel's pool, crediting it, and makes the
// CRNG reseed now, so the fork's next random bytes differ from the
// source's.
func reseed(seed []byte) error {
	if len(seed) == 0 {
		return nil
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		f.Write(seed) // mixed in, if not credited
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("reseed the CRNG: %w", e)
	}
	return nil
}

// newBootID gives the fork a boot id of its own: the kernel's is fixed at
// boot, so a file with a new one is bind-mounted over it.
func newBootID() (string, error) {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	if err := os.WriteFile(bootIDFile, []byte(id+"\n"), 0o444); err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	const target = "/proc/sys/kernel/random/boot_id"
	unix.Unmount(target, unix.MNT_DETACH) // a fork of a fork
	if err := unix.Mount(bootIDFile, target, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("boot id: bind mount over %s: %w", target, err)
	}
	return id, nil
}

// setFSUUID changes the UUID of the mounted ext4 filesystem f is on.
func setFSUUID(f *os.File, uuid string) error {
	raw, err := hex.DecodeString(strings.ReplaceAll(uuid, "-", ""))
	if err != nil || len(raw) != 16 {
		return fmt.Errorf("bad UUID %q", uuid)
	}
	buf := make([]byte, 8+16)
	binary.NativeEndian.PutUint32(buf[0:], 16)
	copy(buf[8:], raw)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ext4SetFSUUID, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("set the filesystem UUID: %w", e)
	}
	return nil
}
