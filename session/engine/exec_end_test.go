package engine

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/berthvm/berth/session"
)

// TestExecEndStoredBeforeReported: when an exec's end is reported (Wait
// returns, as the API stream's final record does), its end is already in
// the store, and all the output the command wrote just before it exited
// has been delivered, byte for byte.
func TestExecEndStoredBeforeReported(t *testing.T) {
	m := newAgentManager(t, 0)
	ctx := t.Context()
	if _, err := m.Create(ctx, session.CreateOptions{Name: "ends"}); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	for i := range 20 {
		p, err := m.Exec(ctx, "ends", session.ExecRequest{Argv: []string{"sh", "-c", "seq 1 20000; echo last >&2; exit 3"}})
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		for c := range p.Output() {
			switch c.Stream {
			case session.Stdout:
				out.Write(c.Data)
			case session.Stderr:
				errOut.Write(c.Data)
			}
		}
		x, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := m.st.GetExec(x.ID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != string(session.ExecExited) || rec.ExitCode == nil || *rec.ExitCode != 3 || rec.EndedAt.IsZero() {
			t.Fatalf("run %d: reported %s, but the store holds %s (exit %v) at that moment", i, x.State, rec.State, rec.ExitCode)
		}
		if !bytes.Equal(out.Bytes(), want.Bytes()) || errOut.String() != "last\n" {
			t.Fatalf("run %d: got %d bytes of stdout (want %d), stderr %q", i, out.Len(), want.Len(), strings.TrimSpace(errOut.String()))
		}
		if x.StdoutBytes != int64(want.Len()) || rec.StdoutBytes != int64(want.Len()) {
			t.Fatalf("run %d: record says %d / store %d stdout bytes, want %d", i, x.StdoutBytes, rec.StdoutBytes, want.Len())
		}
	}
}
