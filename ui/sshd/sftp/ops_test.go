package sftp

import "testing"

func TestWsPath(t *testing.T) {
	for in, want := range map[string]string{
		"/workspace": "/workspace", "/workspace/a/b": "/workspace/a/b", "/workspace/a/../b": "/workspace/b",
		"/": "", "/etc": "", "/workspace/..": "", "/workspacex": "", "/work": "", "/workspace/a\x00b": "",
	} {
		got, err := wsPath(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("wsPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
