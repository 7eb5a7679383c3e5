package app

import (
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
)

// A build's progress without a terminal: each setup step's own line, with
// its count from 1, the files step included; its output and notes below
// it, marked as such.
func TestBuildProgressSteps(t *testing.T) {
	var out strings.Builder
	p := newBuildProgress(&out, false)
	for _, ev := range []session.BuildProgress{
		{Phase: "setup", Line: "booting a build VM of the image"},
		{Phase: "setup", Done: 1, Total: 3, Line: "copy files"},
		{Phase: "setup", Done: 2, Total: 3, Line: "$ make"},
		{Phase: "setup", Line: "cc -o tool tool.c"},
		{Phase: "setup", Done: 3, Total: 3, Line: "$ false"},
	} {
		p.show(ev)
	}
	p.end()
	want := `  | booting a build VM of the image
setup 1/3: copy files
setup 2/3: $ make
  | cc -o tool tool.c
setup 3/3: $ false
`
	if out.String() != want {
		t.Errorf("progress:\n%s\nwant:\n%s", out.String(), want)
	}
}

// What image ls shows as an image's source, and what an import says of
// the image's config.
func TestImageSourceAndConfigNotes(t *testing.T) {
	for _, tt := range []struct {
		info session.ImageInfo
		want string
	}{
		{session.ImageInfo{Source: "berth"}, "berth"},
		{session.ImageInfo{}, "-"},
		{session.ImageInfo{Source: "docker-archive:-", SourceDigest: "sha256:0123456789abcdef0123"}, "docker-archive:- sha256:0123456789ab"},
		{session.ImageInfo{Source: "oci-layout:/srv/app", SourceDigest: "sha256:short"}, "oci-layout:/srv/app sha256:short"},
		{session.ImageInfo{Source: "session:dev", Parent: "debian@0123456789abcdef"}, "session:dev on debian@0123456789abcdef"},
		{session.ImageInfo{Source: "docker-archive:-", SourceDigest: "sha256:short", Lacks: []string{"blobs"}}, "docker-archive:- sha256:short (an older import without its blobs: import it again)"},
		{session.ImageInfo{Source: "oci-layout:/a", SourceDigest: "sha256:short", Lacks: []string{"blobs", "config"}}, "oci-layout:/a sha256:short (an older import without its blobs and config: import it again)"},
	} {
		if got := imageSource(tt.info); got != tt.want {
			t.Errorf("imageSource(%+v) = %q, want %q", tt.info, got, tt.want)
		}
	}
	notes := strings.Join(configNotes(&session.ImageConfig{Env: []string{"A=1", "B=2"}, User: "app", WorkingDir: "/srv"}), "\n")
	for _, want := range []string{"2 variable(s)", "/srv is outside /workspace", "commands and shells run as app (--user overrides)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("configNotes do not say %q:\n%s", want, notes)
		}
	}
	if notes := configNotes(&session.ImageConfig{User: "0:0", WorkingDir: "/workspace/src/"}); len(notes) != 1 || notes[0] != "  commands start in /workspace/src" {
		t.Errorf("configNotes for root in /workspace/src: %q", notes)
	}
	if configNotes(nil) != nil {
		t.Error("configNotes(nil) says something")
	}
}

// What a commit prints: the image and its parent, what was captured with
// the paths that changed most, what was left out, how the disk was
// copied.
func TestPrintCommit(t *testing.T) {
	var out strings.Builder
	printCommit(&out, "dev", session.CommitResult{
		Image: session.ImageInfo{Name: "py-dev", Digest: "aaaa"}, Parent: "debian@bbbb", Bytes: 212 << 20, Files: 1234, Dirs: 56, Deleted: 1,
		Top:     []session.PathBytes{{Path: "/usr/lib/python3", Files: 1000, Bytes: 150 << 20}, {Path: "/etc", Files: 1, Bytes: 12}},
		LeftOut: []session.PathBytes{{Path: "machine id", Files: 1, Bytes: 33}, {Path: "apt's caches", Files: 12, Bytes: 40 << 20}},
		Copy:    "sparse copy", Frozen: 210 * time.Millisecond, Took: 3200 * time.Millisecond, State: session.StateRunning,
	})
	want := `image py-dev (aaaa) committed from session dev on debian@bbbb
captured 212 MiB on disk: 1234 files, 56 directories, 1 path of the image deleted
most change:
  /usr/lib/python3  150 MiB  1000 files
  /etc              12 B     1 file
left out (a new session makes its own):
  machine id    33 B    1 file
  apt's caches  40 MiB  12 files
system disk copied (sparse copy) with the session's commands frozen for 210ms; took 3.2s
`
	if out.String() != want {
		t.Errorf("printCommit:\n%s\nwant:\n%s", out.String(), want)
	}
}
