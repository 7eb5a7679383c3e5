// Package extfs reads the ext4 filesystem of a workspace image on the
// host, in user space: a checkpoint's files for a diff or an undo,
// without mounting the image (which needs root and puts a filesystem the
// guest wrote in front of the host's kernel) and without booting a VM.
//
// The image is the guest's work, so every structure in it is untrusted:
// each offset, count and depth is checked against the image and bounded
// before it is used, and nothing here follows a symlink.
package extfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// ErrCorrupt is the class of an image whose structures make no sense.
var ErrCorrupt = errors.New("corrupt or unsupported ext4 image")

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrCorrupt)
}

// Bounds on what one call reads, whatever the image claims.
const (
	// MaxDirBytes bounds one directory's blocks.
	MaxDirBytes = 64 << 20
	// maxExtents bounds one file's extents.
	maxExtents = 1 << 20
	// maxDepth bounds an extent tree's depth (ext4 itself stops at 5).
	maxDepth = 5
	// maxGroups bounds the block groups (a 16 TiB filesystem of 4 KiB blocks has 131072).
	maxGroups = 1 << 20
)

const (
	featIncompat64bit     = 0x80
	featIncompatExtents   = 0x40
	featIncompatInline    = 0x8000
	featIncompatFiletype  = 0x2
	featIncompatEncrypt   = 0x10000
	featIncompatCasefold  = 0x20000
	featIncompatFlexBG    = 0x200
	featIncompatMetaBG    = 0x10
	featIncompatRecover   = 0x4
	featIncompatJournDev  = 0x8
	featIncompatMMP       = 0x100
	featIncompatCsumSeed  = 0x2000
	featIncompatLargeDir  = 0x4000
	featIncompatEAInode   = 0x400
	featIncompatDirData   = 0x1000
	featIncompatCompress  = 0x1
	inodeFlagExtents      = 0x80000
	inodeFlagInline       = 0x10000000
	inodeFlagEncrypt      = 0x800
	extentMagic           = 0xF30A
	rootIno               = 2
	sbOffset              = 1024
	supportedIncompatBits = featIncompat64bit | featIncompatExtents | featIncompatFiletype | featIncompatFlexBG |
		featIncompatMetaBG | featIncompatRecover | featIncompatMMP | featIncompatCsumSeed | featIncompatLargeDir
)

// FS is an open image.
type FS struct {
	r              io.ReaderAt
	size           int64
	blockSize      int64
	inodeSize      int64
	inodesPerGroup uint32
	inodesCount    uint32
	itable         []uint64 // each group's inode table, in blocks
}

// Open reads the superblock and group descriptors of the image r of size
// bytes.
func Open(r io.ReaderAt, size int64) (*FS, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, sbOffset); err != nil {
		return nil, fmt.Errorf("read superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[56:]) != 0xEF53 {
		return nil, corrupt("no ext4 superblock")
	}
	logBS := le.Uint32(sb[24:])
	if logBS > 6 {
		return nil, corrupt("block size 2^(10+%d)", logBS)
	}
	f := &FS{r: r, size: size, blockSize: 1024 << logBS}
	f.inodesCount = le.Uint32(sb[0:])
	f.inodesPerGroup = le.Uint32(sb[40:])
	firstData := int64(le.Uint32(sb[20:]))
	blocksPerGroup := int64(le.Uint32(sb[32:]))
	incompat := le.Uint32(sb[96:])
	if le.Uint32(sb[76:]) == 0 {
		f.inodeSize = 128
	} else {
		f.inodeSize = int64(le.Uint16(sb[88:]))
	}
	if bad := incompat &^ supportedIncompatBits; bad != 0 {
		return nil, corrupt("filesystem features %#x are not read here", bad)
	}
	if incompat&featIncompatMetaBG != 0 {
		return nil, corrupt("meta_bg layouts are not read here")
	}
	if f.inodeSize < 128 || f.inodeSize > f.blockSize || f.inodeSize&(f.inodeSize-1) != 0 {
		return nil, corrupt("inode size %d", f.inodeSize)
	}
	if f.inodesPerGroup == 0 || blocksPerGroup == 0 || f.inodesCount == 0 {
		return nil, corrupt("empty groups")
	}
	groups := (int64(f.inodesCount) + int64(f.inodesPerGroup) - 1) / int64(f.inodesPerGroup)
	if groups > maxGroups {
		return nil, corrupt("%d block groups", groups)
	}
	descSize := int64(32)
	if incompat&featIncompat64bit != 0 {
		descSize = int64(le.Uint16(sb[254:]))
		if descSize < 32 || descSize > 1024 || descSize&(descSize-1) != 0 {
			return nil, corrupt("group descriptor size %d", descSize)
		}
	}
	gdt := make([]byte, groups*descSize)
	if _, err := r.ReadAt(gdt, (firstData+1)*f.blockSize); err != nil {
		return nil, fmt.Errorf("read group descriptors: %w", err)
	}
	f.itable = make([]uint64, groups)
	for g := range groups {
		d := gdt[g*descSize:]
		t := uint64(le.Uint32(d[8:]))
		if descSize >= 64 {
			t |= uint64(le.Uint32(d[0x28:])) << 32
		}
		f.itable[g] = t
	}
	return f, nil
}

// Inode is one file's metadata.
type Inode struct {
	Num   uint32
	Mode  fs.FileMode
	Size  int64
	Gen   uint32
	Links uint16
	Ctime time.Time
	Mtime time.Time
	flags uint32
	block [60]byte
}

// ID is the file's identity, as the guest's agent reports it:
// "inode:generation".
func (in *Inode) ID() string { return fmt.Sprintf("%d:%d", in.Num, in.Gen) }

// Inode reads inode n.
func (f *FS) Inode(n uint32) (*Inode, error) {
	if n == 0 || n > f.inodesCount {
		return nil, corrupt("inode %d out of range", n)
	}
	g, i := (n-1)/f.inodesPerGroup, (n-1)%f.inodesPerGroup
	off := int64(f.itable[g])*f.blockSize + int64(i)*f.inodeSize
	if off <= 0 || off+f.inodeSize > f.size {
		return nil, corrupt("inode %d lies outside the image", n)
	}
	b := make([]byte, f.inodeSize)
	if _, err := f.r.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("read inode %d: %w", n, err)
	}
	le := binary.LittleEndian
	in := &Inode{Num: n, Links: le.Uint16(b[26:]), Gen: le.Uint32(b[100:]), flags: le.Uint32(b[32:])}
	in.Mode = fileMode(le.Uint16(b[0:]))
	in.Size = int64(le.Uint32(b[4:])) | int64(le.Uint32(b[108:]))<<32
	if in.Size < 0 {
		return nil, corrupt("inode %d size", n)
	}
	copy(in.block[:], b[40:100])
	ctime, mtime := int64(int32(le.Uint32(b[12:]))), int64(int32(le.Uint32(b[16:])))
	var cx, mx uint32
	if f.inodeSize > 128 {
		extra := int64(le.Uint16(b[128:]))
		if 128+extra <= f.inodeSize {
			if extra >= 8 {
				cx = le.Uint32(b[132:])
			}
			if extra >= 12 {
				mx = le.Uint32(b[136:])
			}
		}
	}
	in.Ctime, in.Mtime = extraTime(ctime, cx), extraTime(mtime, mx)
	return in, nil
}

// extraTime joins a timestamp's seconds with its extra field (two more
// epoch bits, then nanoseconds).
func extraTime(sec int64, extra uint32) time.Time {
	sec += int64(extra&3) << 32
	return time.Unix(sec, int64(extra>>2)%1e9)
}

// fileMode converts an ext4 i_mode.
func fileMode(m uint16) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch m & 0xF000 {
	case 0x4000:
		mode |= fs.ModeDir
	case 0xA000:
		mode |= fs.ModeSymlink
	case 0x1000:
		mode |= fs.ModeNamedPipe
	case 0xC000:
		mode |= fs.ModeSocket
	case 0x2000:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case 0x6000:
		mode |= fs.ModeDevice
	case 0x8000:
	default:
		mode |= fs.ModeIrregular
	}
	return mode
}

// extent maps file blocks [logical, logical+n) to image blocks from phys;
// an uninitialised extent reads as zeros.
type extent struct {
	logical, n int64
	phys       int64
	zero       bool
}

// extents lists a file's extents in logical order.
func (f *FS) extents(in *Inode) ([]extent, error) {
	if in.flags&inodeFlagInline != 0 {
		return nil, corrupt("inode %d keeps its data inline, which is not read here", in.Num)
	}
	if in.flags&inodeFlagEncrypt != 0 {
		return nil, corrupt("inode %d is encrypted", in.Num)
	}
	if in.flags&inodeFlagExtents == 0 {
		if in.Size == 0 {
			return nil, nil
		}
		return nil, corrupt("inode %d maps its blocks without extents, which is not read here", in.Num)
	}
	var out []extent
	err := f.walkExtents(in.block[:], 0, &out)
	return out, err
}

func (f *FS) walkExtents(node []byte, level int, out *[]extent) error {
	le := binary.LittleEndian
	if len(node) < 12 || le.Uint16(node[0:]) != extentMagic {
		return corrupt("extent header")
	}
	entries, depth := int(le.Uint16(node[2:])), int(le.Uint16(node[6:]))
	if 12+entries*12 > len(node) || depth > maxDepth || level > maxDepth {
		return corrupt("extent node of %d entries at depth %d", entries, depth)
	}
	for i := range entries {
		e := node[12+i*12:]
		if depth == 0 {
			n := int64(le.Uint16(e[4:]))
			zero := false
			if n > 32768 {
				n -= 32768
				zero = true
			}
			phys := int64(le.Uint16(e[6:]))<<32 | int64(le.Uint32(e[8:]))
			if len(*out) >= maxExtents {
				return corrupt("more than %d extents", maxExtents)
			}
			if phys <= 0 || (phys+n)*f.blockSize > f.size {
				return corrupt("extent outside the image")
			}
			*out = append(*out, extent{logical: int64(le.Uint32(e[0:])), n: n, phys: phys, zero: zero})
			continue
		}
		leaf := int64(le.Uint16(e[8:]))<<32 | int64(le.Uint32(e[4:]))
		if leaf <= 0 || (leaf+1)*f.blockSize > f.size {
			return corrupt("extent index outside the image")
		}
		b := make([]byte, f.blockSize)
		if _, err := f.r.ReadAt(b, leaf*f.blockSize); err != nil {
			return fmt.Errorf("read extent block: %w", err)
		}
		if err := f.walkExtents(b, level+1, out); err != nil {
			return err
		}
	}
	return nil
}

// Reader returns a reader of a regular file's (or a long symlink's)
// bytes: holes and uninitialised extents read as zeros.
func (f *FS) Reader(in *Inode) (io.Reader, error) {
	ex, err := f.extents(in)
	if err != nil {
		return nil, err
	}
	return &fileReader{f: f, ex: ex, size: in.Size}, nil
}

type fileReader struct {
	f    *FS
	ex   []extent
	size int64
	off  int64
}

func (r *fileReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-r.off)]
	bs := r.f.blockSize
	blk := r.off / bs
	in := r.off % bs
	// Find the extent holding blk; extents are few and sorted, so skip
	// those ending before it.
	for len(r.ex) > 0 && r.ex[0].logical+r.ex[0].n <= blk {
		r.ex = r.ex[1:]
	}
	var n int
	switch {
	case len(r.ex) == 0 || r.ex[0].logical > blk:
		// A hole up to the next extent (or the end).
		end := r.size
		if len(r.ex) > 0 {
			end = min(end, r.ex[0].logical*bs)
		}
		n = int(min(int64(len(p)), end-r.off))
		clear(p[:n])
	case r.ex[0].zero:
		e := r.ex[0]
		n = int(min(int64(len(p)), (e.logical+e.n)*bs-r.off))
		clear(p[:n])
	default:
		e := r.ex[0]
		n = int(min(int64(len(p)), (e.logical+e.n)*bs-r.off))
		pos := (e.phys+blk-e.logical)*bs + in
		if _, err := r.f.r.ReadAt(p[:n], pos); err != nil {
			return 0, fmt.Errorf("read file data: %w", err)
		}
	}
	r.off += int64(n)
	return n, nil
}

// ReadFile reads a regular file whole, refusing one over limit bytes.
func (f *FS) ReadFile(in *Inode, limit int64) ([]byte, error) {
	if in.Size > limit {
		return nil, fmt.Errorf("file of %d bytes is over the %d byte limit", in.Size, limit)
	}
	r, err := f.Reader(in)
	if err != nil {
		return nil, err
	}
	b := make([]byte, in.Size)
	_, err = io.ReadFull(r, b)
	return b, err
}

// Readlink returns a symlink's target.
func (f *FS) Readlink(in *Inode) (string, error) {
	if in.Mode.Type() != fs.ModeSymlink {
		return "", corrupt("inode %d is no symlink", in.Num)
	}
	if in.Size > 4096 {
		return "", corrupt("symlink of %d bytes", in.Size)
	}
	if in.flags&(inodeFlagExtents|inodeFlagInline) == 0 && in.Size < 60 {
		return string(in.block[:in.Size]), nil // a fast symlink: the target is in the inode
	}
	if in.flags&inodeFlagInline != 0 {
		if in.Size > 60 {
			return "", corrupt("inline symlink of %d bytes", in.Size)
		}
		return string(in.block[:in.Size]), nil
	}
	b, err := f.ReadFile(in, 4096)
	return string(b), err
}

// Dirent is a directory entry.
type Dirent struct {
	Name  string
	Inode uint32
}

// ReadDir lists a directory, without "." and "..".
func (f *FS) ReadDir(in *Inode) ([]Dirent, error) {
	if !in.Mode.IsDir() {
		return nil, corrupt("inode %d is no directory", in.Num)
	}
	b, err := f.ReadFile(in, MaxDirBytes)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	var out []Dirent
	for blk := int64(0); blk < int64(len(b)); blk += f.blockSize {
		block := b[blk:min(int64(len(b)), blk+f.blockSize)]
		for off := 0; off+8 <= len(block); {
			ino := le.Uint32(block[off:])
			recLen := int(le.Uint16(block[off+4:]))
			nameLen := int(block[off+6])
			if recLen < 8 || off+recLen > len(block) || 8+nameLen > recLen {
				return nil, corrupt("directory %d entry at %d", in.Num, blk+int64(off))
			}
			// Inode 0 marks a free slot, an htree node or a checksum tail:
			// the rest of such a slot holds no entry.
			if ino != 0 {
				name := string(block[off+8 : off+8+nameLen])
				if name != "." && name != ".." {
					if name == "" || strings.ContainsAny(name, "/\x00") {
						return nil, corrupt("directory %d holds the name %q", in.Num, name)
					}
					out = append(out, Dirent{Name: name, Inode: ino})
				}
			}
			off += recLen
		}
	}
	return out, nil
}

// ErrSymlinkOnPath is a lookup through a symlink: nothing here follows
// one, and a caller that named such a path is told so.
var ErrSymlinkOnPath = errors.New("a directory on the path is a symlink")

// Lookup finds rel (slash-separated, relative to the root, no "..")
// without following symlinks; a missing path is fs.ErrNotExist.
func (f *FS) Lookup(rel string) (*Inode, error) {
	in, err := f.Inode(rootIno)
	if err != nil {
		return nil, err
	}
	if rel == "" || rel == "." {
		return in, nil
	}
	parts := strings.Split(path.Clean(rel), "/")
	for i, part := range parts {
		if part == ".." {
			return nil, fmt.Errorf("%q climbs: %w", rel, fs.ErrInvalid)
		}
		switch {
		case in.Mode.Type() == fs.ModeSymlink:
			return nil, fmt.Errorf("%s: %w", path.Join(parts[:i]...), ErrSymlinkOnPath)
		case !in.Mode.IsDir():
			return nil, fmt.Errorf("%s: %w", rel, fs.ErrNotExist)
		}
		ents, err := f.ReadDir(in)
		if err != nil {
			return nil, err
		}
		var next uint32
		for _, e := range ents {
			if e.Name == part {
				next = e.Inode
				break
			}
		}
		if next == 0 {
			return nil, fmt.Errorf("%s: %w", rel, fs.ErrNotExist)
		}
		if in, err = f.Inode(next); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// Walk calls fn for every entry under the directory dir (relative path
// dirRel), depth first, directories before what they hold. It follows no
// symlink, and bounds the depth so a directory that holds itself cannot
// loop it.
func (f *FS) Walk(dirRel string, dir *Inode, fn func(rel string, in *Inode) error) error {
	return f.walk(dirRel, dir, fn, 0)
}

const maxWalkDepth = 4096

func (f *FS) walk(rel string, dir *Inode, fn func(string, *Inode) error, depth int) error {
	if depth > maxWalkDepth {
		return corrupt("directories nested over %d deep", maxWalkDepth)
	}
	ents, err := f.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		in, err := f.Inode(e.Inode)
		if err != nil {
			return err
		}
		p := path.Join(rel, e.Name)
		if err := fn(p, in); err != nil {
			return err
		}
		if in.Mode.IsDir() {
			if err := f.walk(p, in, fn, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}
