package ext4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
)

// extent maps len blocks of a file from logical block lblk to physical
// block pblk; unwritten ones read as zeros.
type extent struct {
	lblk, len uint32
	pblk      uint64
	unwritten bool
}

// extents lists a file's extents in logical order, checked: inside the
// filesystem, not overlapping, at most as many as the file has blocks.
func (fs *FS) extents(in *Inode) ([]extent, error) {
	if in.flags&flagExtents == 0 {
		if in.Size == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("inode %d maps its blocks without extents (ext2/ext3), which berth does not read", in.Ino)
	}
	if in.Size > fs.maxFile {
		return nil, fmt.Errorf("inode %d is a file of %d bytes, over %d (16 times its filesystem): berth does not read it", in.Ino, in.Size, fs.maxFile)
	}
	fileBlocks := (uint64(in.Size) + uint64(fs.blockSize) - 1) / uint64(fs.blockSize)
	var out []extent
	// Each node is read once: a crafted tree's index entries could all
	// point at one node, or at a node above them.
	seen := map[uint64]bool{}
	var walk func(node []byte, depth int) error
	walk = func(node []byte, depth int) error {
		le := binary.LittleEndian
		if len(node) < 12 || le.Uint16(node[0:]) != 0xF30A {
			return fmt.Errorf("inode %d: corrupt extent tree (no header magic)", in.Ino)
		}
		entries, d := int(le.Uint16(node[2:])), int(le.Uint16(node[6:]))
		if 12+12*entries > len(node) {
			return fmt.Errorf("inode %d: corrupt extent tree (%d entries in a node of %d bytes)", in.Ino, entries, len(node))
		}
		if d != depth {
			return fmt.Errorf("inode %d: corrupt extent tree (depth %d where %d was expected)", in.Ino, d, depth)
		}
		for i := 0; i < entries; i++ {
			e := node[12+12*i:]
			if depth == 0 {
				x := extent{lblk: le.Uint32(e[0:]), len: uint32(le.Uint16(e[4:]))}
				if x.len > 32768 {
					x.len -= 32768
					x.unwritten = true
				}
				x.pblk = uint64(le.Uint16(e[6:]))<<32 | uint64(le.Uint32(e[8:]))
				if x.len == 0 || uint64(x.lblk) >= fileBlocks {
					continue // blocks kept past the end (fallocate) hold nothing
				}
				if x.pblk+uint64(x.len) > fs.blocks || x.pblk == 0 {
					return fmt.Errorf("inode %d: an extent points outside the filesystem", in.Ino)
				}
				if uint64(len(out)) >= fileBlocks {
					return fmt.Errorf("inode %d: more extents than the file has blocks", in.Ino)
				}
				out = append(out, x)
				continue
			}
			child := uint64(le.Uint16(e[8:]))<<32 | uint64(le.Uint32(e[4:]))
			if child == 0 || child >= fs.blocks {
				return fmt.Errorf("inode %d: an extent index points outside the filesystem", in.Ino)
			}
			if seen[child] {
				return fmt.Errorf("inode %d: corrupt extent tree (a node reached twice)", in.Ino)
			}
			seen[child] = true
			b := make([]byte, fs.blockSize)
			if _, err := fs.r.ReadAt(b, int64(child)*fs.blockSize); err != nil {
				return fmt.Errorf("inode %d: read an extent block: %w", in.Ino, err)
			}
			if err := walk(b, depth-1); err != nil {
				return err
			}
		}
		return nil
	}
	depth := int(binary.LittleEndian.Uint16(in.block[6:]))
	if depth > maxExtentDepth {
		return nil, fmt.Errorf("inode %d: extent tree %d deep, over the limit of %d", in.Ino, depth, maxExtentDepth)
	}
	if err := walk(in.block[:], depth); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lblk < out[j].lblk })
	for i := 1; i < len(out); i++ {
		if uint64(out[i-1].lblk)+uint64(out[i-1].len) > uint64(out[i].lblk) {
			return nil, fmt.Errorf("inode %d: corrupt extent tree (extents overlap)", in.Ino)
		}
	}
	return out, nil
}

// Open returns a reader of a regular file's (or a slow symlink's or a
// directory's) Size bytes: holes and unwritten extents read as zeros.
func (fs *FS) Open(in *Inode) (io.Reader, error) {
	ext, err := fs.extents(in)
	if err != nil {
		return nil, err
	}
	return &fileReader{fs: fs, ext: ext, size: in.Size}, nil
}

type fileReader struct {
	fs   *FS
	ext  []extent
	size int64
	off  int64
}

func (f *fileReader) Read(p []byte) (int, error) {
	if f.off >= f.size {
		return 0, io.EOF
	}
	if int64(len(p)) > f.size-f.off {
		p = p[:f.size-f.off]
	}
	bs := f.fs.blockSize
	// Drop extents wholly before the offset.
	for len(f.ext) > 0 && (int64(f.ext[0].lblk)+int64(f.ext[0].len))*bs <= f.off {
		f.ext = f.ext[1:]
	}
	if len(f.ext) == 0 || int64(f.ext[0].lblk)*bs > f.off {
		// A hole, up to the next extent or the end.
		end := f.size
		if len(f.ext) > 0 {
			end = min(end, int64(f.ext[0].lblk)*bs)
		}
		n := int(min(int64(len(p)), end-f.off))
		clear(p[:n])
		f.off += int64(n)
		return n, nil
	}
	x := f.ext[0]
	within := f.off - int64(x.lblk)*bs
	n := int(min(int64(len(p)), int64(x.len)*bs-within))
	if x.unwritten {
		clear(p[:n])
	} else {
		k, err := f.fs.r.ReadAt(p[:n], int64(x.pblk)*bs+within)
		if k < n {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return k, fmt.Errorf("read file data: %w", err)
		}
	}
	f.off += int64(n)
	return n, nil
}

// DirEntry is one name in a directory.
type DirEntry struct {
	Name string
	Ino  uint32
}

// ReadDir lists a directory's entries but "." and "..", in the order
// they are stored. Names holding '/' or NUL are refused.
func (fs *FS) ReadDir(in *Inode, max int) ([]DirEntry, error) {
	if in.Type() != ModeDir {
		return nil, fmt.Errorf("inode %d is not a directory", in.Ino)
	}
	if in.Size%fs.blockSize != 0 {
		return nil, fmt.Errorf("directory inode %d has size %d, not a whole number of blocks", in.Ino, in.Size)
	}
	r, err := fs.Open(in)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	var out []DirEntry
	block := fs.buf
	for {
		if _, err := io.ReadFull(r, block); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("directory inode %d: %w", in.Ino, err)
		}
		for off := 0; off+8 <= len(block); {
			ino := le.Uint32(block[off:])
			recLen := int(le.Uint16(block[off+4:]))
			nameLen := int(block[off+6])
			if recLen == 0 && fs.blockSize == 65536 {
				recLen = 65536
			}
			if recLen < 8 || off+recLen > len(block) || recLen%4 != 0 {
				return nil, fmt.Errorf("directory inode %d: corrupt entry (record length %d)", in.Ino, recLen)
			}
			if ino != 0 {
				if 8+nameLen > recLen {
					return nil, fmt.Errorf("directory inode %d: corrupt entry (a name longer than its record)", in.Ino)
				}
				name := string(block[off+8 : off+8+nameLen])
				switch {
				case name == "." || name == "..":
				case name == "" || nameLen > maxNameLen || containsAny(name, "/\x00"):
					return nil, fmt.Errorf("directory inode %d holds the name %q, which no path can have", in.Ino, name)
				default:
					if len(out) >= max {
						return nil, fmt.Errorf("directory inode %d holds over %d entries", in.Ino, max)
					}
					out = append(out, DirEntry{Name: name, Ino: ino})
				}
			}
			off += recLen
		}
	}
}

func containsAny(s, chars string) bool {
	for i := 0; i < len(s); i++ {
		for j := 0; j < len(chars); j++ {
			if s[i] == chars[j] {
				return true
			}
		}
	}
	return false
}

// Xattr is one extended attribute, named as getxattr(2) names it.
type Xattr struct {
	Name  string
	Value []byte
}

// Attribute name prefixes by ext4's name index.
var xattrPrefix = map[byte]string{
	1: "user.", 2: "system.posix_acl_access", 3: "system.posix_acl_default",
	4: "trusted.", 6: "security.", 7: "system.", 8: "system.richacl",
}

// Xattrs returns an inode's extended attributes, those in the inode
// first, then those in its attribute block, POSIX ACLs in the form
// getxattr(2) gives them.
func (fs *FS) Xattrs(in *Inode) ([]Xattr, error) {
	le := binary.LittleEndian
	var out []Xattr
	if extra := in.extraSize(); extra > 0 {
		start := 128 + extra
		if start+4 <= int64(len(in.raw)) && le.Uint32(in.raw[start:]) == 0xEA020000 {
			region := in.raw[start+4:]
			x, err := parseXattrs(region, region, in.Ino)
			if err != nil {
				return nil, err
			}
			out = append(out, x...)
		}
	}
	if in.fileACL != 0 {
		if in.fileACL >= fs.blocks {
			return nil, fmt.Errorf("inode %d: its attribute block is outside the filesystem", in.Ino)
		}
		b := make([]byte, fs.blockSize)
		if _, err := fs.r.ReadAt(b, int64(in.fileACL)*fs.blockSize); err != nil {
			return nil, fmt.Errorf("inode %d: read its attribute block: %w", in.Ino, err)
		}
		if le.Uint32(b[0:]) != 0xEA020000 || le.Uint32(b[8:]) != 1 {
			return nil, fmt.Errorf("inode %d: corrupt attribute block", in.Ino)
		}
		x, err := parseXattrs(b[32:], b, in.Ino)
		if err != nil {
			return nil, err
		}
		out = append(out, x...)
	}
	return out, nil
}

// parseXattrs reads the entries starting at entries; values are at
// offsets from base.
func parseXattrs(entries, base []byte, ino uint32) ([]Xattr, error) {
	le := binary.LittleEndian
	var out []Xattr
	corrupt := func(what string) error { return fmt.Errorf("inode %d: corrupt extended attribute (%s)", ino, what) }
	for off := 0; off+4 <= len(entries) && le.Uint32(entries[off:]) != 0; {
		if off+16 > len(entries) {
			return nil, corrupt("an entry past the end")
		}
		e := entries[off:]
		nameLen, index := int(e[0]), e[1]
		valOff, valInum, valSize := int(le.Uint16(e[2:])), le.Uint32(e[4:]), int(le.Uint32(e[8:]))
		if 16+nameLen > len(e) {
			return nil, corrupt("a name past the end")
		}
		suffix := string(e[16 : 16+nameLen])
		prefix, ok := xattrPrefix[index]
		if !ok {
			return nil, fmt.Errorf("inode %d: extended attribute %q has name index %d, which berth does not know", ino, suffix, index)
		}
		if valInum != 0 {
			return nil, fmt.Errorf("inode %d: extended attribute %s%s is kept in an inode of its own (ea_inode), which berth does not read", ino, prefix, suffix)
		}
		if valOff+valSize > len(base) || valSize < 0 {
			return nil, corrupt("a value past the end")
		}
		val := append([]byte(nil), base[valOff:valOff+valSize]...)
		if index == 2 || index == 3 {
			var err error
			if val, err = aclFromDisk(val); err != nil {
				return nil, fmt.Errorf("inode %d: %s: %w", ino, prefix, err)
			}
		}
		out = append(out, Xattr{Name: prefix + suffix, Value: val})
		off += (16 + nameLen + 3) &^ 3
	}
	return out, nil
}

// ACL entry tags (acl(5)) that carry an id.
const (
	aclUser  = 0x02
	aclGroup = 0x08
)

// aclFromDisk turns ext4's on-disk POSIX ACL (version 1, short entries
// for the tags without an id) into the xattr form (version 2, every
// entry 8 bytes, id -1 where there is none).
func aclFromDisk(b []byte) ([]byte, error) {
	le := binary.LittleEndian
	if len(b) < 4 || le.Uint32(b) != 1 {
		return nil, errors.New("not an ext4 ACL (version 1)")
	}
	out := le.AppendUint32(nil, 2)
	for off := 4; off < len(b); {
		if off+4 > len(b) {
			return nil, errors.New("a truncated ACL entry")
		}
		tag, perm := le.Uint16(b[off:]), le.Uint16(b[off+2:])
		id := uint32(0xFFFFFFFF)
		off += 4
		if tag == aclUser || tag == aclGroup {
			if off+4 > len(b) {
				return nil, errors.New("a truncated ACL entry")
			}
			id = le.Uint32(b[off:])
			off += 4
		}
		out = le.AppendUint16(out, tag)
		out = le.AppendUint16(out, perm)
		out = le.AppendUint32(out, id)
	}
	return out, nil
}
