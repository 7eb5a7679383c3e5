package session

import (
	"strings"
	"testing"
)

// An export's progress: the manifest and config first, then each layer
// with its own bytes, a report per layer begun and per 4 MiB, the end
// left to the caller.
func TestExportProgress(t *testing.T) {
	x := ImageExport{Name: "app", Digest: "d1", Manifest: "sha256:" + strings.Repeat("a", 64), Size: 20 << 20,
		Layers: []ExportLayer{
			{Digest: "sha256:" + strings.Repeat("b", 64), Size: 1000, Offset: 2048},
			{Digest: "sha256:" + strings.Repeat("c", 64), Size: 12 << 20, Offset: 4096, Made: true},
		}}
	for _, c := range []struct {
		n    int64
		want BuildProgress
	}{
		{0, BuildProgress{Phase: "export", Bytes: 0, TotalBytes: 20 << 20, Line: "the image's manifest and config"}},
		{2048 + 10, BuildProgress{Phase: "export", Done: 1, Total: 2, Bytes: 10, TotalBytes: 1000, Line: "layer 1 of 2 (sha256:bbbbbbbbbbbb, as imported)"}},
		{4096 + 5, BuildProgress{Phase: "export", Done: 2, Total: 2, Bytes: 5, TotalBytes: 12 << 20, Line: "layer 2 of 2 (sha256:cccccccccccc, made from its berth layer)"}},
		{20 << 20, BuildProgress{Phase: "done", Line: "exported image app (d1): 2 layer(s), 20 MiB, manifest sha256:aaaaaaaaaaaa"}},
	} {
		if got := x.ProgressAt(c.n); got != c.want {
			t.Errorf("ProgressAt(%d) = %+v, want %+v", c.n, got, c.want)
		}
	}
	var got []string
	next := int64(0)
	for n := int64(0); n < x.Size; n += 1 << 20 {
		for _, k := range []int64{0, 2048, 4096} {
			if n == 0 {
				next = ReportExport(x, k, next, func(p BuildProgress) { got = append(got, p.Line) })
			}
		}
		next = ReportExport(x, n+4096, next, func(p BuildProgress) { got = append(got, p.Line) })
	}
	if len(got) != 7 || !strings.HasPrefix(got[1], "layer 1 of 2") || !strings.HasPrefix(got[2], "layer 2 of 2") {
		t.Errorf("reports %q: want one per layer begun and per 4 MiB", got)
	}
	// One write of the whole tarball still says its last layer.
	got = nil
	ReportExport(x, 0, 0, func(p BuildProgress) { got = append(got, p.Line) })
	ReportExport(x, x.Size, 4<<20, func(p BuildProgress) { got = append(got, p.Line) })
	if len(got) != 2 || !strings.HasPrefix(got[1], "layer 2 of 2") {
		t.Errorf("reports %q for one write of it all: want the last layer said", got)
	}
}
