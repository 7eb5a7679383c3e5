package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestZZExpTrack(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.Data, "config.toml"), []byte("memory = \"256M\"\ndisk = \"1G\"\nidle_timeout = \"0\"\ncheckpoint_limit = 100\n"), 0o644)
	e.StartDaemon()
	e.OK("create", "b")
	e.OK("exec", "b", "--", "sh", "-c", "mkdir src && d=0; while [ $d -lt 100 ]; do mkdir src/$d; f=0; while [ $f -lt 100 ]; do echo $d $f > src/$d/$f; f=$((f+1)); done; d=$((d+1)); done; "+
		"tar cf t.tar src && rm -rf src && tar tf t.tar | wc -l")
	timed := func(label, run, dir string) {
		args := []string{"exec"}
		if run != "" {
			args = append(args, "--run", run)
		}
		script := "a=$(cut -d' ' -f14,15 /proc/1/stat); s=$(date +%s%N); mkdir " + dir + " && tar xf t.tar -C " + dir + "; x=$(date +%s%N); b=$(cut -d' ' -f14,15 /proc/1/stat); echo tar_ms=$(( (x-s)/1000000 )) agent_before=$a agent_after=$b"
		out := e.OK(append(args, "b", "--", "sh", "-c", script)...)
		t.Logf("%s: %s", label, strings.TrimSpace(out))
	}
	timed("plain", "", "p0")
	timed("plain", "", "p1")
	id := strings.TrimSpace(e.OK("run", "start", "b"))
	timed("run, no keep", id, "r0")
	e.OK("run", "end", id)
	id = strings.TrimSpace(e.OK("run", "start", "b", "--keep"))
	timed("run, keep (tracked)", id, "k0")
	timed("run, keep (tracked)", id, "k1")
	e.OK("run", "rm", id)
	timed("plain after rm", "", "p2")
	t.Logf("%s", e.OK("exec", "b", "--", "sh", "-c", "cat /proc/sys/fs/fanotify/max_queued_events; nproc; uname -r"))
}
