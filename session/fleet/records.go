package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/berthvm/berth/session"
)

// HostRecord is what a host registers at hosts/H (and, with Left, at
// seen/H).
type HostRecord struct {
	ID        string   `json:"id"`
	Addr      string   `json:"addr"`
	CPUs      int      `json:"cpus"`
	MemoryMiB int64    `json:"mem_mib"`
	DiskFree  int64    `json:"disk_free"`
	Floor     int64    `json:"floor"`
	Images    []string `json:"images,omitempty"`
	Draining  bool     `json:"draining,omitempty"`
	// Instance is the data directory's own id: a daemon restarted on the
	// same data directory may take over its predecessor's registration.
	Instance string `json:"instance,omitempty"`
	// Since is when this registration began; At when it was written.
	Since time.Time `json:"since"`
	At    time.Time `json:"at"`
	// Left is set in seen/H by a clean stop.
	Left bool `json:"left,omitempty"`
}

// Alloc is what placement promised a host, at alloc/H.
type Alloc struct {
	CPUs      int   `json:"cpus"`
	MemoryMiB int64 `json:"mem_mib"`
	Sessions  int   `json:"sessions"`
}

// Owner is the host holding a session, at sessions/S/owner.
type Owner struct {
	Host string `json:"host"`
}

// Bounds of a record's fields: beyond them a record is refused, not
// believed.
const (
	maxCPUs    = 1 << 16
	maxMemMiB  = 1 << 40
	maxImages  = 1024
	maxAddrLen = 256
)

// decode reads one JSON value of at most MaxRecord bytes, refusing
// unknown fields and trailing data.
func decode(b []byte, v any) error {
	if len(b) > MaxRecord {
		return fmt.Errorf("record of %d bytes, over the %d bound", len(b), MaxRecord)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the record")
	}
	return nil
}

// ParseHostRecord reads and checks a host record; key is its host id.
func ParseHostRecord(key string, b []byte) (HostRecord, error) {
	var r HostRecord
	if err := decode(b, &r); err != nil {
		return r, fmt.Errorf("host record %q: %w", key, err)
	}
	if err := r.check(); err != nil {
		return r, fmt.Errorf("host record %q: %w", key, err)
	}
	if r.ID != key {
		return r, fmt.Errorf("host record %q names host %q", key, r.ID)
	}
	return r, nil
}

func (r HostRecord) check() error {
	if err := ValidateHostID(r.ID); err != nil {
		return err
	}
	switch {
	case len(r.Addr) > maxAddrLen:
		return fmt.Errorf("address of %d bytes", len(r.Addr))
	case r.CPUs < 0 || r.CPUs > maxCPUs:
		return fmt.Errorf("cpus %d out of range", r.CPUs)
	case r.MemoryMiB < 0 || r.MemoryMiB > maxMemMiB:
		return fmt.Errorf("memory %d MiB out of range", r.MemoryMiB)
	case r.DiskFree < 0 || r.Floor < 0:
		return fmt.Errorf("negative disk figures")
	case len(r.Images) > maxImages:
		return fmt.Errorf("%d images, over %d", len(r.Images), maxImages)
	case len(r.Instance) > 64:
		return fmt.Errorf("instance id of %d bytes", len(r.Instance))
	}
	for _, im := range r.Images {
		if len(im) == 0 || len(im) > 128 {
			return fmt.Errorf("image name of %d bytes", len(im))
		}
	}
	return nil
}

// ParseAlloc reads and checks an allocation record.
func ParseAlloc(b []byte) (Alloc, error) {
	var a Alloc
	if err := decode(b, &a); err != nil {
		return a, fmt.Errorf("allocation: %w", err)
	}
	if a.CPUs < 0 || a.CPUs > maxCPUs*1024 || a.MemoryMiB < 0 || a.MemoryMiB > maxMemMiB || a.Sessions < 0 || a.Sessions > 1<<30 {
		return a, fmt.Errorf("allocation out of range: %+v", a)
	}
	return a, nil
}

// ParseOwner reads and checks an owner record.
func ParseOwner(b []byte) (Owner, error) {
	var o Owner
	if err := decode(b, &o); err != nil {
		return o, fmt.Errorf("owner: %w", err)
	}
	return o, ValidateHostID(o.Host)
}

// ValidateHostID checks a host id: a session name's rules (1-63
// lowercase letters, digits and dashes), since it is a key segment and
// will be a DNS-ish name in moves.
func ValidateHostID(id string) error {
	if err := session.ValidateName(id); err != nil || id == "" {
		return fmt.Errorf("invalid host id %q: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit: %w", id, session.ErrInvalid)
	}
	return nil
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the package's own record types reach here
	}
	return string(b)
}

// ReplicaRecord says that a host keeps a copy of a checkpoint, at
// sessions/S/replicas/H/ID.
type ReplicaRecord struct {
	Memory   bool      `json:"memory,omitempty"`
	TakenAt  time.Time `json:"taken_at"`
	CopiedAt time.Time `json:"copied_at"`
	Bytes    int64     `json:"bytes"`
}

// ParseReplica reads a replica record.
func ParseReplica(b []byte) (ReplicaRecord, error) {
	var r ReplicaRecord
	if err := decode(b, &r); err != nil {
		return r, fmt.Errorf("replica record: %w", err)
	}
	if r.Bytes < 0 {
		return r, fmt.Errorf("replica record of %d bytes", r.Bytes)
	}
	return r, nil
}
