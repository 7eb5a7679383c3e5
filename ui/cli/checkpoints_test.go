package cli_test

import (
	"strings"
	"testing"

	"github.com/berthvm/berth/session/sessiontest"
	"github.com/berthvm/berth/ui/cli"
)

func TestCheckpointCommands(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "demo")
	runAll(t, w, []tc{
		{name: "none yet", args: []string{"checkpoints", "demo"}, stderr: "demo has no checkpoints ('berth checkpoint demo' takes one)\n"},
		{name: "take", args: []string{"checkpoint", "demo", "--label", "green"}, stdout: "~checkpoint c1 of demo: workspace, "},
		{name: "memory", args: []string{"checkpoint", "demo", "--memory"}, stdout: "~checkpoint c2 of demo: workspace+memory"},
		{name: "list", args: []string{"checkpoints", "demo"}, stdout: "~green"},
		{name: "json", args: []string{"checkpoints", "demo", "--json"}, stdout: "~\"label\": \"green\""},
		{name: "info counts them", args: []string{"info", "demo"}, stdout: "~Checkpoints:"},
		{name: "restore, no terminal, no --yes", args: []string{"restore", "demo", "c1"}, code: 2, stderr: "~without confirmation: stdin is not a terminal; add --yes"},
		{name: "restore unknown", args: []string{"restore", "demo", "c9", "--yes"}, code: 1,
			stderr: "berth: session \"demo\" has no checkpoint \"c9\" (`berth checkpoints demo` lists them): not found\n"},
		{name: "restore, wrong name", args: []string{"restore", "demo", "c1"}, code: 1, env: cli.Env{StdinTTY: true, Stdin: strings.NewReader("dmeo\n")},
			stderr: "~nothing was changed"},
		{name: "restore", args: []string{"restore", "demo", "c1"}, env: cli.Env{StdinTTY: true, Stdin: strings.NewReader("demo\n")},
			stdout: "restored demo to checkpoint c1; it is running; the state before is checkpoint c3 ('berth restore demo c3' goes back)\n", stderr: "~Type the session name to confirm: "},
		{name: "rm", args: []string{"checkpoint", "rm", "demo", "c2"}, stdout: "removed checkpoint c2 of demo\n"},
		{name: "rm again", args: []string{"checkpoint", "rm", "demo", "c2"}, code: 1, stderr: "~checkpoint \"c2\": session \"demo\" has no such checkpoint"},
		{name: "fork bad name", args: []string{"fork", "demo", "Bad_Name"}, code: 2, stderr: "~invalid session name"},
		{name: "fork exists", args: []string{"fork", "demo", "demo"}, code: 1, stderr: "~already exists"},
		{name: "fork", args: []string{"fork", "demo", "demo2"}, stdout: "~forked demo into demo2 in "},
		{name: "forked runs", args: []string{"info", "demo2"}, stdout: "~running"},
		{name: "delete says checkpoints", args: []string{"delete", "demo"}, code: 1, env: cli.Env{StdinTTY: true, Stdin: strings.NewReader("no\n")},
			stderr: "~and its 2 checkpoint(s)"},
	})
}

func TestCreateFrom(t *testing.T) {
	w := newWorld(t, sessiontest.Options{})
	w.sh(t, "create", "src")
	w.sh(t, "checkpoint", "src", "--memory")
	runAll(t, w, []tc{
		{name: "from a checkpoint", args: []string{"create", "new", "--from", "src@c1"},
			stdout: "created new: running, 1 CPU, 512 MiB memory, 4.0 GiB disk, image mini on qemu\ncreated from checkpoint src@c1 by cli\n"},
		{name: "from the newest", args: []string{"create", "newer", "--from", "src"}, stdout: "~created from checkpoint src@c1 by cli\n"},
		{name: "unknown checkpoint", args: []string{"create", "x", "--from", "src@c9"}, code: 1,
			stderr: "berth: --from src@c9: session \"src\" has no checkpoint \"c9\" (list its checkpoints to see their ids)\n"},
		{name: "no checkpoints", args: []string{"create", "x", "--from", "new"}, code: 1,
			stderr: "berth: --from new: session \"new\" has no checkpoints (take one of it first)\n"},
		{name: "unknown session", args: []string{"create", "x", "--from", "ghost@c1"}, code: 1,
			stderr: "berth: --from ghost@c1: there is no session \"ghost\" to take a checkpoint of (list the sessions to see their names)\n"},
		{name: "malformed", args: []string{"create", "x", "--from", "src@"}, code: 2, stderr: "~--from \"src@\": the checkpoint id after @ is empty or malformed"},
		{name: "with an image", args: []string{"create", "x", "--from", "src", "--image", "mini"}, code: 2,
			stderr: "~--image \"mini\" cannot be chosen for a session made from a checkpoint"},
		{name: "a memory checkpoint on more CPUs", args: []string{"create", "x", "--from", "src", "--cpus", "2"}, code: 1,
			stderr: "berth: --cpus 2 differs from the 1 of the VM in the checkpoint (leave it out: memory checkpoint c1 resumes its VM as it was)\n"},
	})
}
