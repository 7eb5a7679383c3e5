package engine

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthvm/berth/guest"
	"github.com/berthvm/berth/guest/agent"
	"github.com/berthvm/berth/guest/image"
)

// localAgent is the real agent serving a temporary workspace on this
// host, over a socket pair: what a build VM's agent does, without the VM.
func localAgent(t *testing.T) *guest.Client {
	t.Helper()
	a, err := agent.New(agent.Config{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "agent")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	host, guestEnd := conn(fds[0]), conn(fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { a.ServeConn(ctx, guestEnd); close(served) }()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	c, err := guest.Connect(cctx, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); cancel(); <-served })
	return c
}

// A recipe's setup steps count from 1, the same in the progress and in
// the error; the files are a step of their own, named for what it is.
func TestSetupStepNumbers(t *testing.T) {
	c := localAgent(t)
	for _, tc := range []struct {
		name  string
		steps []string
		want  []string // the progress lines that carry a count
		err   string
	}{
		{"one step", []string{"true"}, []string{"setup 1/1: $ true"}, ""},
		{"the second of three fails",
			[]string{"echo one", "echo two; exit 3", "echo three"},
			[]string{"setup 1/3: $ echo one", "setup 2/3: $ echo two; exit 3"},
			"setup step 2 of 3 (`echo two; exit 3`) exited with code 3: two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			b := image.StepBuild{Steps: tc.steps, Timeout: time.Minute, Report: func(p image.Progress) {
				if p.Total > 0 {
					got = append(got, p.String())
				}
			}}
			err := runSetup(context.Background(), c, b)
			if msg := errText(err); msg != tc.err {
				t.Errorf("error %q, want %q", msg, tc.err)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("progress:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestSetupStepNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []byte
		steps []string
		want  []string // name | header
	}{
		{"steps only", nil, []string{"make", "echo hi"}, []string{"`make` | $ make", "`echo hi` | $ echo hi"}},
		{"files first", []byte("tar"), []string{"make"}, []string{"copy files | copy files", "`make` | $ make"}},
		{"files alone", []byte("tar"), nil, []string{"copy files | copy files"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, st := range setupSteps(image.StepBuild{Files: tc.files, Steps: tc.steps}) {
				got = append(got, st.name+" | "+st.header)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
