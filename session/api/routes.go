package api

import (
	"fmt"
	"net/http"
	"strings"
)

// route is one endpoint of the API. The table in routes is the one list:
// NewServer registers it, the package doc's Routes section is written from
// it (TestRoutesDoc fails when they differ: go test -run TestRoutesDoc
// -update rewrites the doc), and TestClientCallsAreRoutes fails when the
// client calls a path the table lacks.
type route struct {
	method, pattern string
	doc             string // what the call takes → what it answers
	handler         http.HandlerFunc
}

func (s *server) routes() []route {
	svc := s.svc
	return []route{
		{"GET", "/v1/version", `{"api":"v1","version":...}`, s.getVersion},
		{"GET", "/v1/watch", "NDJSON session.Event stream (?since_rev=N: a fleet's changes after revision N)", s.watch},
		{"GET", "/v1/host", "HostStatus", s.host},
		{"GET", "/v1/hosts", "HostList (the fleet's hosts; fleet false: not in one)", s.hosts},
		{"POST", "/v1/hosts/{id}/drain", "NDJSON drainFrame stream: a DrainStep per session, then the DrainResult", s.drainHost},
		{"POST", "/v1/hosts/{id}/undrain", "204: placement may pick the host again", s.undrainHost},

		{"GET", "/v1/sessions", "[]Session", s.list},
		{"POST", "/v1/sessions", "CreateOptions → 201 Session", s.create},
		{"GET", "/v1/sessions/{name}", "Session", s.get},
		{"DELETE", "/v1/sessions/{name}", "204", s.delete},
		{"POST", "/v1/sessions/{name}/pause", "Session", s.lifecycle(svc.Pause)},
		{"POST", "/v1/sessions/{name}/sleep", "Session", s.lifecycle(svc.Sleep)},
		{"POST", "/v1/sessions/{name}/resume", "Session", s.lifecycle(svc.Resume)},
		{"POST", "/v1/sessions/{name}/stop", "Session", s.lifecycle(svc.Stop)},
		{"POST", "/v1/sessions/{name}/start", "Session", s.lifecycle(svc.Start)},
		{"POST", "/v1/sessions/{name}/flush", "FlushResult", s.flush},
		{"POST", "/v1/sessions/{name}/replace", "ReplaceOptions (body optional) → ReplaceResult", s.replace},
		{"GET", "/v1/sessions/{name}/timeline", "?limit=N → []Event", s.timeline},
		{"GET", "/v1/sessions/{name}/history", "[]Sample (the last HistoryWindow)", s.history},
		{"GET", "/v1/sessions/{name}/net", "NetStatus", s.netStatus},
		{"PUT", "/v1/sessions/{name}/net", `{"policy"} → Session`, s.setNet},
		{"GET", "/v1/sessions/{name}/forward/{port}", "upgrade: a byte stream to the guest's 127.0.0.1:port", s.forward},

		{"POST", "/v1/sessions/{name}/checkpoints", "CheckpointOptions → 201 Checkpoint", s.checkpoint},
		{"GET", "/v1/sessions/{name}/checkpoints", "[]Checkpoint", s.checkpoints},
		{"DELETE", "/v1/sessions/{name}/checkpoints/{id}", "204", s.deleteCheckpoint},
		{"POST", "/v1/sessions/{name}/restore", `{"id"} → RestoreResult`, s.restore},
		{"POST", "/v1/sessions/{name}/fork", `{"name"} → 201 ForkResult`, s.fork},
		{"GET", "/v1/sessions/{name}/diff", "?from=ID&to=ID&patch=true&path=P… → Diff (no to: with now)", s.diff},

		{"POST", "/v1/sessions/{name}/exec", "full duplex NDJSON (see inFrame, outFrame)", s.exec},
		{"GET", "/v1/sessions/{name}/executions", "?all=true → []Execution", s.executions},
		{"GET", "/v1/execs/{id}", "Execution", s.execution},
		{"GET", "/v1/execs/{id}/output", "?from=S&limit=N → OutputPage (at most 1000 chunks)", s.output},
		{"GET", "/v1/execs/{id}/attach", "?from=S → output stream", s.attach},
		{"POST", "/v1/execs/{id}/attach", "?from=S → output stream, duplex (stdin, resize)", s.attach},
		{"POST", "/v1/execs/{id}/cancel", "204", s.cancel},

		{"GET", "/v1/sessions/{name}/files/{path...}", "content; ?op=stat FileInfo, ?op=list []FileInfo", s.fileGet},
		{"PUT", "/v1/sessions/{name}/files/{path...}", `body → {"written":N}, once durable`, s.filePut},
		{"POST", "/v1/sessions/{name}/files/{path...}", "?op=mkdir 204; ?op=rename&to=PATH 204", s.filePost},
		{"DELETE", "/v1/sessions/{name}/files/{path...}", "204", s.fileDelete},
		// Trees have their own route, not a files ?op=: a daemon without it
		// then answers "no route" instead of writing the tar as one file.
		{"GET", "/v1/sessions/{name}/tree/{path...}", "tar of the file or tree, then a trailer", s.treeGet},
		{"PUT", "/v1/sessions/{name}/tree/{path...}", "tar body → CopyResult, once durable", s.treePut},

		{"GET", "/v1/images", "[]ImageInfo", s.images},
		{"POST", "/v1/images", "BuildRequest → NDJSON build stream (see buildFrame)", s.buildImage},
		{"POST", "/v1/images/{name}/import", "?source=PATH|-&ref=R, body: the image for - → NDJSON build stream", s.importImage},
		{"POST", "/v1/images/{name}/commit", `{"session","label"} → 201 CommitResult`, s.commitImage},
		{"GET", "/v1/images/{name}/export", "?digest=D → NDJSON progress, the ImageExport, its tarball's bytes, a trailer", s.exportImage},
		{"DELETE", "/v1/images/{name}", "204", s.removeImage},

		{"POST", "/v1/sessions/{name}/runs", "RunOptions → 201 Run", s.withHarness(s.startRun)},
		{"GET", "/v1/sessions/{name}/runs", "[]Run", s.withHarness(s.runs)},
		{"GET", "/v1/runs/{id}", "Run with its executions' ids", s.withHarness(s.getRun)},
		{"POST", "/v1/runs/{id}/end", `{"status":S} → Run`, s.withHarness(s.endRun)},
		{"DELETE", "/v1/runs/{id}", "RemovedRun: the record and its starting point removed", s.withHarness(s.removeRun)},
		{"GET", "/v1/runs/{id}/diff", "?patch=true&path=P… → Diff against the run's starting point", s.runDiff},
		{"POST", "/v1/runs/{id}/undo", `{"paths":[…]} (none: all) → UndoResult`, s.undoRun},
		{"POST", "/v1/sessions/{name}/schedules", "ScheduleRequest → 201 Schedule", s.withHarness(s.addSchedule)},
		{"GET", "/v1/sessions/{name}/schedules", "[]Schedule", s.withHarness(s.schedules)},
		{"DELETE", "/v1/sessions/{name}/schedules/{id}", "204", s.withHarness(s.removeSchedule)},

		{"GET", "/v1/sessions/{name}/bundle", "a stopped or sleeping session's move bundle (cut off on error)", s.sendBundle},
		{"POST", "/v1/sessions/{name}/drop", "204: the copy of a session moved to another host removed", s.dropSent},
		{"GET", "/v1/sessions/{name}/image-bundle", "the image build the session was made on, as a bundle (cut off on error)", s.sendImageBundle},
		{"POST", "/v1/sessions/{name}/move", `{"to"} → MoveResult: the session moved to host to (a fleet's)`, s.moveTo},
		{"POST", "/v1/moves", "a move bundle → 201 MoveStaged", s.receiveBundle},
		{"POST", "/v1/moves/images", "an image build's bundle → 204 (409: here already)", s.receiveImage},
		{"POST", "/v1/moves/{name}/commit", "Session: the staged session made this host's", s.commitMove},
		{"DELETE", "/v1/moves/{name}", "204: the staged session removed", s.discardMove},
		{"POST", "/v1/sessions/{name}/checkpoints/{id}/replicate", `{"to"} → Replica: the checkpoint copied to host to (a fleet's)`, s.replicateCheckpoint},
		{"POST", "/v1/sessions/{name}/recover", "RecoverOptions → RecoverResult: a gone host's session started from a replica", s.recoverSession},
		{"GET", "/v1/sessions/{name}/checkpoints/{id}/bundle", "a checkpoint's replica bundle (cut off on error)", s.sendReplicaBundle},
		{"POST", "/v1/replicas", "a replica bundle → 201 Replica", s.receiveReplica},
		{"GET", "/v1/replicas", "?session=NAME → []Replica: the replicas this host keeps", s.listReplicas},
		{"POST", "/v1/replicas/{name}/{id}/stage", "MoveStaged: the replica staged for a recovery", s.stageReplica},
		{"DELETE", "/v1/replicas/{name}/{id}", "204: the replica removed", s.dropReplica},
	}
}

// routesDoc renders the table as the package doc's Routes section.
func routesDoc(rs []route) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "//\t%-6s %-42s %s\n", r.method, r.pattern, r.doc)
	}
	return b.String()
}
