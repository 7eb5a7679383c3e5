package engine_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/vmm"
	"github.com/berthvm/berth/vmm/qemu"
	"github.com/berthvm/berth/vmm/vmmtest"
)

// traceFields parses the key=value pairs of slog text lines whose msg is
// msg, keyed by their exec field.
func traceFields(log, msg string) map[string]map[string]string {
	kv := regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)
	out := map[string]map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `msg="`+msg+`"`) {
			continue
		}
		f := map[string]string{}
		for _, m := range kv.FindAllStringSubmatch(l, -1) {
			f[m[1]] = strings.Trim(m[2], `"`)
		}
		out[f["exec"]] = f
	}
	return out
}

// traceTime reads an absolute time (unix nanoseconds) or a duration field.
func traceTime(f map[string]string, key string) time.Time {
	n, _ := strconv.ParseInt(f[key], 10, 64)
	return time.Unix(0, n)
}

func traceDur(f map[string]string, key string) time.Duration {
	d, _ := time.ParseDuration(f[key])
	return d
}

// TestBenchExec prints issue 28's exec figure: `berth exec -- true` p50
// against the same exec at the agent, both in this run, and the phase
// table of a traced exec (BERTH_TRACE=1 on the CLI, berth serve -v), each
// phase's median. It runs only under `make bench`.
func TestBenchExec(t *testing.T) {
	needBench(t)
	// The limit: exec true at the agent, on a VM of its own, measured
	// in turns with berth exec so that both see the same load (this
	// machine's other work comes and goes within a run).
	dir := t.TempDir()
	b := vmmtest.Boot(t, qemu.New(qemu.Options{}), filepath.Join(dir, "vm"), filepath.Join(dir, "ws.img"), vmm.NewUUID())
	agentExec := func() time.Duration {
		start := time.Now()
		if r := vmmtest.Run(t, b.Agent, "", "true"); r.Err != nil {
			t.Fatal(r.Err)
		}
		return time.Since(start)
	}

	// The session's VM has the reference's shape (vmmtest.Boot's 2 vCPUs
	// and 512 MiB): under TCG one vCPU less makes the guest's own work
	// slower, which is not berth's.
	e := newBenchEnv(t, "memory = \"256M\"\ndisk = \"64M\"\nidle_timeout = \"0\"\n", "-v")
	e.OK("create", "bench", "--cpus", strconv.Itoa(b.Config.CPUs), "--memory", strconv.Itoa(b.Config.MemoryMiB)+"M")
	for range 5 { // warm-up: the guest's code paths translated once
		e.OK("exec", "bench", "--", "true")
		agentExec()
	}
	var cliRT, agentRT, verRT []time.Duration
	for range 60 {
		start := time.Now()
		e.OK("exec", "bench", "--", "true")
		cliRT = append(cliRT, time.Since(start))
		agentRT = append(agentRT, agentExec())
		start = time.Now()
		e.OK("exec", "--help")
		verRT = append(verRT, time.Since(start))
	}
	b.Agent.Close()
	b.VM.Kill(t.Context())
	t.Logf("BENCH %-40s %10s vs agent %10s  ratio %.2fx  (target ≤ 1.5x; berth exec --help %s)", "berth exec -- true p50 (exec)",
		median(cliRT).Round(time.Microsecond), median(agentRT).Round(time.Microsecond),
		float64(median(cliRT))/float64(median(agentRT)), median(verRT).Round(time.Microsecond))

	// The phase table: every phase's median over traced execs, from the
	// CLI's and the daemon's clocks (one host, one clock).
	phases := []string{"CLI process start", "connect (ping)", "request → handler", "handler → engine", "start record stored",
		"agent start", "guest run → exit seen", "end record stored", "→ reply sent", "reply → CLI has it", "CLI exit"}
	spans := map[string][]time.Duration{}
	type cliRun struct {
		start, end time.Time
		f          map[string]string
	}
	var runs []cliRun
	for range 30 {
		c := e.Cmd("exec", "bench", "--", "true")
		c.Env = append(c.Env, "BERTH_TRACE=1")
		var errb bytes.Buffer
		c.Stderr = &errb
		start := time.Now()
		if err := c.Run(); err != nil {
			t.Fatalf("%v: %s", err, errb.String())
		}
		end := time.Now()
		for _, f := range traceFields(errb.String(), "exec phases") {
			runs = append(runs, cliRun{start, end, f})
		}
	}
	log, _ := os.ReadFile(filepath.Join(e.Data, "test-daemon.log"))
	eng, srv := traceFields(string(log), "exec phases"), traceFields(string(log), "exec stream phases")
	for _, r := range runs {
		id := r.f["exec"]
		ef, sf := eng[id], srv[id]
		if ef == nil || sf == nil {
			t.Fatalf("no daemon trace of %s", id)
		}
		began := traceTime(r.f, "began")
		connected := began.Add(traceDur(r.f, "connect"))
		final := connected.Add(traceDur(r.f, "start") + traceDur(r.f, "output") + traceDur(r.f, "final"))
		recv := traceTime(sf, "recv")
		replied := recv.Add(traceDur(sf, "head") + traceDur(sf, "output") + traceDur(sf, "reply"))
		estart := traceTime(ef, "start")
		recorded := estart.Add(traceDur(ef, "record"))
		agent := recorded.Add(traceDur(ef, "agent_start"))
		exited := agent.Add(traceDur(ef, "run"))
		ended := exited.Add(traceDur(ef, "end_record"))
		marks := []time.Time{r.start, began, connected, recv, estart, recorded, agent, exited, ended, replied, final, r.end}
		for i, p := range phases {
			spans[p] = append(spans[p], marks[i+1].Sub(marks[i]))
		}
		spans["total"] = append(spans["total"], r.end.Sub(r.start))
	}
	var tab strings.Builder
	for _, p := range append(phases, "total") {
		fmt.Fprintf(&tab, "\n    %-24s %9s", p, median(spans[p]).Round(10*time.Microsecond))
	}
	t.Logf("BENCH %-40s (medians of %d)%s", "berth exec -- true, phases", len(runs), tab.String())
}
