// Package ext4 reads the tree of an ext4 filesystem image without
// mounting it: directories, inodes with their owners, modes, times,
// device numbers and extended attributes, symlink targets and file
// contents. It reads what mkfs.ext4 -d and the kernel write on berth's
// layers and system disks (extents, 64-bit, flex_bg, metadata_csum,
// htree directories) and refuses, by name, the features it does not
// read (inline data, encryption, block maps, a journal to replay).
//
// An image may be a guest's (a committed system disk): every number in
// it is checked against the filesystem's size before it is used, block
// maps and extent trees are bounded in depth and entries, and nothing
// read is kept beyond what one call returns.
package ext4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Feature bits (s_feature_incompat) this package reads; any other is
// refused.
const (
	incompatFiletype = 0x2
	incompatRecover  = 0x4
	incompatMetaBG   = 0x10
	incompatExtents  = 0x40
	incompat64Bit    = 0x80
	incompatMMP      = 0x100
	incompatFlexBG   = 0x200
	incompatCsumSeed = 0x2000
	incompatLargeDir = 0x4000

	incompatKnown = incompatFiletype | incompatExtents | incompat64Bit | incompatMMP | incompatFlexBG | incompatCsumSeed | incompatLargeDir
)

// incompatNames names the features refused, for the error.
var incompatNames = map[uint32]string{
	0x1: "compression", incompatRecover: "needs_recovery (a journal to replay: run e2fsck first)", 0x8: "journal_dev",
	incompatMetaBG: "meta_bg", 0x400: "ea_inode", 0x1000: "dirdata", 0x8000: "inline_data", 0x10000: "encrypt", 0x20000: "casefold",
}

// Inode flags.
const (
	flagExtents    = 0x80000
	flagInlineData = 0x10000000
)

// File types (st_mode's S_IFMT).
const (
	ModeType   = 0o170000
	ModeDir    = 0o040000
	ModeFile   = 0o100000
	ModeSym    = 0o120000
	ModeChar   = 0o020000
	ModeBlock  = 0o060000
	ModeFifo   = 0o010000
	ModeSocket = 0o140000
)

// RootIno is the root directory's inode number.
const RootIno = 2

// Bounds on what one image may make this package do.
const (
	maxExtentDepth = 5       // the kernel's limit
	maxGroups      = 1 << 22 // 512 TiB at 128 MiB a group
	maxNameLen     = 255
)

// FS is an open ext4 image. Its methods may be called from one
// goroutine at a time.
type FS struct {
	r          io.ReaderAt
	blockSize  int64
	blocks     uint64 // s_blocks_count
	inodes     uint32 // s_inodes_count
	perGroup   uint32 // inodes per group
	inodeSize  int64
	inodeTable []uint64 // per group: the inode table's first block
	buf        []byte   // one block, for directory and xattr reads
	// maxFile bounds a file's size: a sparse file may be larger than its
	// filesystem, but one many times larger is not read (its holes would
	// be read as zeros for as long as it says).
	maxFile int64
}

// Open reads the superblock and group descriptors of the image in r,
// which is size bytes long. An image whose journal still needs
// replaying (copied from a filesystem mounted and not frozen) is
// refused: its metadata in place may be stale. A freeze (FIFREEZE, as a
// checkpoint of a running session is taken) writes the journal back and
// clears the flag, so such a copy opens.
func Open(r io.ReaderAt, size int64) (*FS, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, 1024); err != nil {
		return nil, fmt.Errorf("read the superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != 0xEF53 {
		return nil, errors.New("not an ext2/3/4 filesystem (no superblock magic)")
	}
	fs := &FS{r: r}
	logBS := le.Uint32(sb[0x18:])
	if logBS > 6 { // 64 KiB
		return nil, fmt.Errorf("block size 2^%d is not one ext4 has", 10+logBS)
	}
	fs.blockSize = 1024 << logBS
	incompat := le.Uint32(sb[0x60:])
	if bad := incompat &^ incompatKnown; bad != 0 {
		for bit := uint32(1); bit != 0; bit <<= 1 {
			if bad&bit != 0 {
				name := incompatNames[bit]
				if name == "" {
					name = fmt.Sprintf("incompat 0x%x", bit)
				}
				return nil, fmt.Errorf("the filesystem uses feature %s, which berth does not read", name)
			}
		}
	}
	fs.blocks = uint64(le.Uint32(sb[0x4:]))
	if incompat&incompat64Bit != 0 {
		fs.blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	if fs.blocks == 0 || fs.blocks > uint64(size)/uint64(fs.blockSize) {
		return nil, fmt.Errorf("the superblock says %d blocks of %d bytes, and the image is %d bytes: it is truncated or corrupt", fs.blocks, fs.blockSize, size)
	}
	firstData := uint64(le.Uint32(sb[0x14:]))
	perGroupBlocks := uint64(le.Uint32(sb[0x20:]))
	fs.inodes = le.Uint32(sb[0x0:])
	fs.perGroup = le.Uint32(sb[0x28:])
	fs.inodeSize = 128
	if le.Uint32(sb[0x4C:]) >= 1 {
		fs.inodeSize = int64(le.Uint16(sb[0x58:]))
	}
	if fs.inodeSize < 128 || fs.inodeSize > fs.blockSize || fs.inodeSize&(fs.inodeSize-1) != 0 {
		return nil, fmt.Errorf("inode size %d is not one ext4 has", fs.inodeSize)
	}
	if perGroupBlocks == 0 || fs.perGroup == 0 || firstData >= fs.blocks {
		return nil, errors.New("corrupt superblock: no blocks or inodes per group")
	}
	groups := (fs.blocks - firstData + perGroupBlocks - 1) / perGroupBlocks
	if groups > maxGroups || uint64(fs.inodes) > groups*uint64(fs.perGroup) {
		return nil, fmt.Errorf("corrupt superblock: %d groups, %d inodes", groups, fs.inodes)
	}
	descSize := int64(32)
	if incompat&incompat64Bit != 0 {
		descSize = int64(le.Uint16(sb[0xFE:]))
		if descSize < 64 || descSize > 1024 || descSize&(descSize-1) != 0 {
			return nil, fmt.Errorf("corrupt superblock: group descriptor size %d", descSize)
		}
	}
	descs := make([]byte, int64(groups)*descSize)
	if _, err := r.ReadAt(descs, int64(firstData+1)*fs.blockSize); err != nil {
		return nil, fmt.Errorf("read the group descriptors: %w", err)
	}
	fs.inodeTable = make([]uint64, groups)
	tableBlocks := (uint64(fs.perGroup)*uint64(fs.inodeSize) + uint64(fs.blockSize) - 1) / uint64(fs.blockSize)
	for g := range fs.inodeTable {
		d := descs[int64(g)*descSize:]
		t := uint64(le.Uint32(d[0x8:]))
		if descSize >= 64 {
			t |= uint64(le.Uint32(d[0x28:])) << 32
		}
		if t == 0 || t+tableBlocks > fs.blocks {
			// Checked when an inode of the group is read: a group
			// whose table is out of range holds no inode in use.
			t = 0
		}
		fs.inodeTable[g] = t
	}
	fs.buf = make([]byte, fs.blockSize)
	fs.maxFile = max(16*size, 1<<30)
	return fs, nil
}

// BlockSize is the filesystem's block size.
func (fs *FS) BlockSize() int64 { return fs.blockSize }

// Inode is one inode, decoded.
type Inode struct {
	Ino   uint32
	Mode  uint32 // st_mode: type and permission bits
	UID   uint32
	GID   uint32
	Size  int64
	Links uint16
	// Gen is i_generation: with Ino, the file's identity across renames
	// (a reused inode number has a new generation).
	Gen   uint32
	Mtime time.Time
	Ctime time.Time
	// Major and Minor are a device's numbers.
	Major, Minor uint32
	flags        uint32
	block        [60]byte // i_block: extents, a fast symlink, a device
	fileACL      uint64
	raw          []byte // the whole on-disk inode, for in-inode xattrs
}

// Type is the inode's file type (ModeDir, ModeFile…).
func (in *Inode) Type() uint32 { return in.Mode & ModeType }

// Inode reads inode ino.
func (fs *FS) Inode(ino uint32) (*Inode, error) {
	if ino == 0 || ino > fs.inodes {
		return nil, fmt.Errorf("inode %d is out of range (the filesystem has %d)", ino, fs.inodes)
	}
	g, idx := (ino-1)/fs.perGroup, (ino-1)%fs.perGroup
	if int(g) >= len(fs.inodeTable) || fs.inodeTable[g] == 0 {
		return nil, fmt.Errorf("inode %d: its group's inode table is out of range", ino)
	}
	raw := make([]byte, fs.inodeSize)
	off := int64(fs.inodeTable[g])*fs.blockSize + int64(idx)*fs.inodeSize
	if _, err := fs.r.ReadAt(raw, off); err != nil {
		return nil, fmt.Errorf("read inode %d: %w", ino, err)
	}
	le := binary.LittleEndian
	in := &Inode{Ino: ino, raw: raw}
	in.Mode = uint32(le.Uint16(raw[0x0:]))
	in.UID = uint32(le.Uint16(raw[0x2:])) | uint32(le.Uint16(raw[0x78:]))<<16
	in.GID = uint32(le.Uint16(raw[0x18:])) | uint32(le.Uint16(raw[0x7A:]))<<16
	in.Size = int64(uint64(le.Uint32(raw[0x4:])) | uint64(le.Uint32(raw[0x6C:]))<<32)
	if in.Size < 0 {
		return nil, fmt.Errorf("inode %d has a size over 2^63", ino)
	}
	in.Links = le.Uint16(raw[0x1A:])
	in.flags = le.Uint32(raw[0x20:])
	in.Gen = le.Uint32(raw[0x64:])
	copy(in.block[:], raw[0x28:0x28+60])
	in.fileACL = uint64(le.Uint32(raw[0x68:])) | uint64(le.Uint16(raw[0x76:]))<<32
	var cx, mx uint32
	if extra := in.extraSize(); extra >= 12 {
		cx, mx = le.Uint32(raw[0x84:]), le.Uint32(raw[0x88:])
	} else if extra >= 8 {
		cx = le.Uint32(raw[0x84:])
	}
	in.Ctime = extraTime(int64(int32(le.Uint32(raw[0xC:]))), cx)
	in.Mtime = extraTime(int64(int32(le.Uint32(raw[0x10:]))), mx)
	if t := in.Type(); t == ModeChar || t == ModeBlock {
		if old := le.Uint32(in.block[0:]); old != 0 {
			in.Major, in.Minor = (old>>8)&0xff, old&0xff
		} else {
			d := le.Uint32(in.block[4:])
			in.Major, in.Minor = (d&0xfff00)>>8, (d&0xff)|((d>>12)&0xfff00)
		}
	}
	if in.flags&flagInlineData != 0 {
		return nil, fmt.Errorf("inode %d keeps its data inline, which berth does not read", ino)
	}
	return in, nil
}

// extraTime joins a timestamp's seconds with its extra field: two more
// epoch bits, then nanoseconds (a count past a second is corrupt: 0).
func extraTime(sec int64, extra uint32) time.Time {
	sec += int64(extra&3) << 32
	nsec := int64(extra >> 2)
	if nsec > 999999999 {
		nsec = 0
	}
	return time.Unix(sec, nsec).UTC()
}

// extraSize is i_extra_isize, or 0 when the inode has no extra fields.
func (in *Inode) extraSize() int64 {
	if len(in.raw) <= 128 {
		return 0
	}
	n := int64(binary.LittleEndian.Uint16(in.raw[0x80:]))
	if 128+n > int64(len(in.raw)) {
		return 0
	}
	return n
}

// Readlink returns a symlink's target.
func (fs *FS) Readlink(in *Inode) (string, error) {
	if in.Type() != ModeSym {
		return "", fmt.Errorf("inode %d is not a symlink", in.Ino)
	}
	if in.Size > 4096 || in.Size == 0 {
		return "", fmt.Errorf("symlink inode %d has a target of %d bytes", in.Ino, in.Size)
	}
	if in.flags&flagExtents == 0 && in.Size < 60 {
		// A fast symlink: the target is where the block map would be.
		return string(in.block[:in.Size]), nil
	}
	b := make([]byte, in.Size)
	r, err := fs.Open(in)
	if err != nil {
		return "", err
	}
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("symlink inode %d: %w", in.Ino, err)
	}
	return string(b), nil
}
