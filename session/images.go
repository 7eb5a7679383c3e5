package session

import (
	"context"
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
	Source    string        `json:"source"` // "berth" or the recipe file
	Kernel    string        `json:"kernel_version"`
	Sessions  []string      `json:"sessions"` // sessions using this build
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
	// RemoveImage deletes every build of an image; refused while a session
	// uses it.
	RemoveImage(ctx context.Context, name string) error
}
