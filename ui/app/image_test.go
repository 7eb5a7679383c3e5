package app

import (
	"strings"
	"testing"

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
