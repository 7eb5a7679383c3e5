package session

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// ImageInfo describes one build of an image.
type ImageInfo struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	// Current is the build new sessions get; older builds stay while
	// sessions made with them exist.
	Current bool `json:"current"`
	// RootFS images boot into read-only layers with a system disk per
	// session; mini's root is its initramfs.
	RootFS    bool          `json:"rootfs"`
	Layers    int           `json:"layers"`
	Packages  int           `json:"packages"`   // Debian packages in its root (installed, not only asked for)
	DiskBytes int64         `json:"disk_bytes"` // on the host's disk
	Built     time.Time     `json:"built"`
	BuildTook time.Duration `json:"build_took,omitempty"`
	// Source is what the image was made from: "berth", the recipe file,
	// or for an imported image its kind and path ("docker-archive:/srv/app.tar",
	// "oci-layout:/srv/app", "docker-archive:-" for a stream).
	Source string `json:"source"`
	// SourceDigest identifies an imported image as its source named it
	// (the OCI manifest's digest, a docker archive's image id); empty for
	// images berth built.
	SourceDigest string `json:"source_digest,omitempty"`
	// Config is what an imported image's config asks of commands run in
	// it; nil for images berth built. A committed image has its parent's.
	Config *ImageConfig `json:"config,omitempty"`
	// Parent is, for an image committed from a session, the build its
	// layers below the committed one are ("debian@1a2b3c4d"); Label is
	// the commit's.
	Parent   string   `json:"parent,omitempty"`
	Label    string   `json:"label,omitempty"`
	Kernel   string   `json:"kernel_version"`
	Sessions []string `json:"sessions"` // sessions using this build
	// Lacks is what an imported image's record lacks that an import
	// keeps now: "blobs" (an export needs them) and "config" (its Env,
	// User and WorkingDir; a create needs it). Importing it again mends it.
	Lacks []string `json:"lacks,omitempty"`
}

// ImageConfig is the part of an imported image's config berth applies:
// Env for managed commands and shells (a command's own env wins),
// WorkingDir as their default directory when it is under /workspace,
// User as whom they run (ExecRequest.User overrides; a new session's
// workspace is that user's).
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	User       string   `json:"user,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
}

// ImportRequest names a container image to import as a berth image.
type ImportRequest struct {
	Name string `json:"name"`
	// Source is a path on the daemon's host: an OCI image layout (a
	// directory or a tar), a docker or podman save archive, or a root
	// filesystem tarball; or "-" for the stream the call carries.
	Source string `json:"source"`
	// Ref picks the image of a source holding several: a tag ("1"), a
	// name and tag ("app:1") or a whole reference.
	Ref string `json:"ref,omitempty"`
}

// ImportStdin is the Source of an import whose bytes the call carries.
const ImportStdin = "-"

// Validate checks a request before anything is read: a name, a source,
// and a stream exactly when the source is "-".
func (r ImportRequest) Validate(hasStream bool) error {
	switch {
	case r.Name == "":
		return &Error{Class: ErrInvalid, Field: FieldName, Msg: "is missing", Hint: "name the image to make"}
	case r.Source == "":
		return &Error{Class: ErrInvalid, Field: FieldSource, Msg: "is missing", Hint: "give an OCI layout, an image archive or a root filesystem tarball, or - for standard input"}
	case r.Source == ImportStdin && !hasStream:
		return &Error{Class: ErrInvalid, Field: FieldSource, Msg: "is standard input, but no stream came with the call"}
	case r.Source != ImportStdin && hasStream:
		return &Error{Class: ErrInvalid, Field: FieldSource, Msg: "is a path, but a stream came with the call too", Hint: "give - as the source to import the stream"}
	case len(r.Ref) > 512:
		return &Error{Class: ErrInvalid, Field: FieldRef, Msg: "is longer than 512 bytes"}
	}
	return nil
}

// ExportRequest names the image build to export.
type ExportRequest struct {
	Name string `json:"name"`
	// Digest picks a build of the image; "" is its current one.
	Digest string `json:"digest,omitempty"`
}

// Validate checks a request before anything is read.
func (r ExportRequest) Validate() error {
	switch {
	case r.Name == "":
		return &Error{Class: ErrInvalid, Field: FieldImage, Msg: "is missing", Hint: "name the image to export"}
	case len(r.Name) > 256 || len(r.Digest) > 256:
		return &Error{Class: ErrInvalid, Field: FieldImage, Msg: "is longer than 256 bytes"}
	}
	return nil
}

// ImageExport describes an export's tarball (an OCI image layout in a
// tar) before a byte of it is written.
type ImageExport struct {
	Name   string `json:"name"`
	Digest string `json:"digest"` // the build exported
	// Manifest is the digest of the image's OCI manifest: the same for
	// an imported image as its source gave it.
	Manifest string `json:"manifest"`
	// Size is the tarball's size in bytes, exactly.
	Size   int64         `json:"size"`
	Layers []ExportLayer `json:"layers"`
}

// ExportLayer is one OCI layer of an export, bottom first.
type ExportLayer struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
	// Offset is where its bytes start in the tarball.
	Offset int64 `json:"offset"`
	// Made: written from a layer berth made (a recipe's, a commit's),
	// not the blob it was imported as.
	Made bool `json:"made,omitempty"`
}

// ProgressAt is an export's progress once written bytes of its tarball
// are out: the layer being written and its bytes, by layer. Every side
// (the engine, a client counting what it receives) says it so.
func (x ImageExport) ProgressAt(written int64) BuildProgress {
	p := BuildProgress{Phase: "export", Bytes: written, TotalBytes: x.Size, Line: "the image's manifest and config"}
	for i := len(x.Layers) - 1; i >= 0; i-- {
		l := x.Layers[i]
		if written < l.Offset {
			continue
		}
		how := "as imported"
		if l.Made {
			how = "made from its berth layer"
		}
		p.Done, p.Total = i+1, len(x.Layers)
		p.Bytes, p.TotalBytes = min(written-l.Offset, l.Size), l.Size
		p.Line = fmt.Sprintf("layer %d of %d (%s, %s)", i+1, len(x.Layers), shortDigest(l.Digest), how)
		break
	}
	if written >= x.Size {
		p = BuildProgress{Phase: "done", Line: fmt.Sprintf("exported image %s (%s): %d layer(s), %s, manifest %s",
			x.Name, x.Digest, len(x.Layers), FormatBytes(x.Size), shortDigest(x.Manifest))}
	}
	return p
}

// ReportExport reports an export's progress once n bytes are out, when
// a new layer has begun or 4 MiB more are out since the last report
// (at next-4 MiB), and returns where the next report is due. The end is
// left to the caller, which says it once the export has succeeded.
func ReportExport(x ImageExport, n, next int64, progress func(BuildProgress)) int64 {
	if x.Size <= 0 {
		return next
	}
	// A write that ends the tarball may carry whole layers: the last of
	// them is said, whole, before the caller says the end.
	at := x.ProgressAt(min(n, x.Size-1))
	if n >= next || at.Done != x.ProgressAt(min(max(next-4<<20, 0), x.Size-1)).Done {
		progress(at)
		return n + 4<<20
	}
	return next
}

// shortDigest shortens a digest for people: "sha256:0123456789ab".
func shortDigest(d string) string {
	if alg, hex, ok := strings.Cut(d, ":"); ok && len(hex) > 12 {
		return alg + ":" + hex[:12]
	}
	return d
}

// BuildRequest names what to build: a shipped image, or a recipe file on
// the daemon's host.
type BuildRequest struct {
	Name   string `json:"name,omitempty"`
	Recipe string `json:"recipe,omitempty"` // absolute path
}

// BuildProgress is one step of an image build.
type BuildProgress struct {
	Phase      string `json:"phase"` // resolve, download, unpack, image, setup, done
	Done       int    `json:"done,omitempty"`
	Total      int    `json:"total,omitempty"`
	Bytes      int64  `json:"bytes,omitempty"`
	TotalBytes int64  `json:"total_bytes,omitempty"`
	Line       string `json:"line,omitempty"`
}

// Imager builds and manages images. The Manager and the socket client
// implement it; image commands run only on the daemon's host.
type Imager interface {
	Images(ctx context.Context) ([]ImageInfo, error)
	// BuildImage builds an image unless one from the same inputs exists,
	// reporting progress as it goes.
	BuildImage(ctx context.Context, req BuildRequest, progress func(BuildProgress)) (ImageInfo, error)
	// ImportImage imports a container image (see ImportRequest) as the
	// image req.Name, reading src when req.Source is "-" (src is nil
	// otherwise) and reporting progress by layer, with bytes. A failed
	// import leaves nothing under the name; importing a name again
	// replaces an earlier import of it (sessions keep the build they
	// were made with), while a name berth builds is refused.
	ImportImage(ctx context.Context, req ImportRequest, src io.Reader, progress func(BuildProgress)) (ImageInfo, error)
	// ExportImage writes a build of an image as an OCI image layout
	// tarball, which berth image import (here or on another host) and
	// podman load read. It reports progress while it prepares (a layer
	// berth made is read once to learn its digest), then calls open with
	// the export's description, whose Size is exact, and writes exactly
	// that many bytes to what open returns, reporting progress as
	// ImageExport.ProgressAt says; an error from open ends the export
	// with it. An image with no root filesystem layers (mini) is refused.
	ExportImage(ctx context.Context, req ExportRequest, open func(ImageExport) (io.Writer, error), progress func(BuildProgress)) (ImageExport, error)
	// CommitImage makes a session's system disk (its changes over its
	// image) a new read-only layer on that image's build: a new image
	// others can create from. The session keeps running on its own disk;
	// a running one is frozen for the copy. What a fresh identity
	// regenerates (machine id, hostname, SSH host keys), /tmp, /var/tmp
	// and apt's caches are left out.
	CommitImage(ctx context.Context, req CommitRequest) (CommitResult, error)
	// RemoveImage deletes every build of an image; refused (ErrConflict,
	// CodeInUse) while a session or an image built on it (committed on
	// it, or a recipe on it) uses it.
	RemoveImage(ctx context.Context, name string) error
}
