package session

import (
	"fmt"
	"strings"
	"time"
)

// CommitRequest names a session whose system disk becomes a new image.
type CommitRequest struct {
	// Session is the session committed; it keeps running on its own disk.
	Session string `json:"session"`
	// Image is the new image's name. A name taken by an image built or
	// imported otherwise is refused; committing to a name committed
	// before makes a new build of it (sessions keep the build they were
	// made with).
	Image string `json:"image"`
	Label string `json:"label,omitempty"`
}

// Validate checks a request before any session is looked at.
func (r CommitRequest) Validate() error {
	if r.Session == "" {
		return &Error{Class: ErrInvalid, Field: FieldSession, Msg: "is missing", Hint: "name the session to commit"}
	}
	if err := ValidateName(r.Session); err != nil {
		return &Error{Class: ErrInvalid, Field: FieldSession, Msg: fmt.Sprintf("%q is not a session name", oneLine(r.Session, 80)), Err: err}
	}
	if err := ValidateImageName(r.Image); err != nil {
		return err
	}
	return ValidateLabel(r.Label)
}

// ValidateImageName checks the name of an image to make: 1-63 of a-z,
// 0-9 and '-', starting with a letter or digit, as the image store
// (guest/image.ValidateName, which names directories with it) has it.
func ValidateImageName(name string) error {
	if name == "" {
		return &Error{Class: ErrInvalid, Field: FieldNewImage, Msg: "is missing", Hint: "name the image to make"}
	}
	if !isName(name) {
		return &Error{Class: ErrInvalid, Field: FieldNewImage, Msg: fmt.Sprintf("%q is not a name: use 1-63 of a-z, 0-9 and '-', starting with a letter or digit", oneLine(name, 80))}
	}
	return nil
}

// oneLine bounds text from a caller for a message: one line, at most n
// bytes.
func oneLine(s string, n int) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + "…"
	}
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// CommitResult reports a commit: the new image, and what its new layer
// captured of the session's system disk and left out.
type CommitResult struct {
	Image ImageInfo `json:"image"`
	// Parent is the build the session's system disk was made on, the
	// new image's layers below its own: "debian@1a2b3c4d".
	Parent string `json:"parent"`
	// Bytes is what the new layer occupies on the host's disk (its
	// files and its filesystem's metadata).
	Bytes int64 `json:"bytes"`
	// Files, Dirs and Deleted count what the layer holds: files (and
	// links) added or changed, directories, and paths of the image
	// below deleted (whiteouts).
	Files   int `json:"files"`
	Dirs    int `json:"dirs"`
	Deleted int `json:"deleted"`
	// Top are the paths with the most change, most first.
	Top []PathBytes `json:"top,omitempty"`
	// LeftOut is what was not carried into the layer: what a fresh
	// identity regenerates and caches that are rebuilt.
	LeftOut []PathBytes `json:"left_out,omitempty"`
	// Copy says how the system disk was copied: "reflink" or "sparse
	// copy"; Frozen how long the session's filesystems were frozen for
	// it (0 when the session had no running VM).
	Copy   string        `json:"copy"`
	Frozen time.Duration `json:"frozen,omitempty"`
	Took   time.Duration `json:"took"`
	// State is the session's state when its disk was copied: a crashed
	// session's disk is as the crash left it (checked and repaired).
	State State `json:"state"`
}

// PathBytes is a path (or a kind of path, for what a commit leaves out)
// and the bytes of the files under it.
type PathBytes struct {
	Path  string `json:"path"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
}

// UnknownSession is the refusal of a call naming a session that does
// not exist, with the name at fault in field FieldSession.
func UnknownSession(name string) *Error {
	return &Error{Class: ErrNotFound, Field: FieldSession, Msg: fmt.Sprintf("%q does not exist", oneLine(name, 80)), Hint: "list the sessions there are"}
}

// ImageInUse is the refusal to remove image name while sessions use it
// or images were built on it (committed on it, or recipes on it), naming
// them (at most ten of each): `image "debian" is used by s1, s2
// (sessions) and app (an image built on it)`.
func ImageInUse(name string, sessions, images []string) *Error {
	list := func(names []string, one, many string) string {
		if len(names) == 0 {
			return ""
		}
		shown, more := names, ""
		if len(shown) > 10 {
			shown, more = shown[:10], fmt.Sprintf(" and %d more", len(names)-10)
		}
		kind := one
		if len(names) > 1 {
			kind = many
		}
		return strings.Join(shown, ", ") + more + " (" + kind + ")"
	}
	var by []string
	for _, p := range []string{list(sessions, "a session", "sessions"), list(images, "an image built on it", "images built on it")} {
		if p != "" {
			by = append(by, p)
		}
	}
	hint := "delete those sessions or replace their VMs with another image first"
	switch {
	case len(sessions) == 0:
		hint = "remove those images first"
	case len(images) > 0:
		hint = "delete those sessions or replace their VMs with another image, and remove those images, first"
	}
	return &Error{Class: ErrConflict, Code: CodeInUse, Msg: fmt.Sprintf("image %q is used by %s", name, strings.Join(by, " and ")), Hint: hint}
}
