package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthvm/berth/session"
	"github.com/berthvm/berth/session/sessiontest"
)

// fuzzRoutes are the routes whose request bodies the server decodes;
// optional says an empty body is allowed.
var fuzzRoutes = []struct {
	method, path string
	optional     bool
}{
	{"POST", "/v1/sessions", false},
	{"POST", "/v1/sessions/demo/replace", true},
	{"PUT", "/v1/sessions/demo/net", false},
	{"POST", "/v1/sessions/demo/runs", true},
	{"POST", "/v1/runs/r0123456789ab/end", false},
	{"POST", "/v1/sessions/demo/schedules", false},
	{"POST", "/v1/sessions/demo/checkpoints", true},
	{"POST", "/v1/sessions/demo/restore", false},
	{"POST", "/v1/sessions/demo/fork", false},
	{"POST", "/v1/images", false},
	{"POST", "/v1/images/app/commit", false},
}

// noImages is the fake with an image store that has nothing and builds
// nothing, so the image routes decode their bodies.
type noImages struct{ *sessiontest.Fake }

func (noImages) Images(context.Context) ([]session.ImageInfo, error) { return nil, nil }

func (noImages) BuildImage(_ context.Context, req session.BuildRequest, _ func(session.BuildProgress)) (session.ImageInfo, error) {
	return session.ImageInfo{}, fmt.Errorf("image %q: the fuzzer builds nothing: %w", req.Name, session.ErrNotFound)
}

func (noImages) RemoveImage(_ context.Context, name string) error {
	return fmt.Errorf("image %q: %w", name, session.ErrNotFound)
}

// knownClasses are the error classes a client can tell apart.
func knownClass(c string) bool {
	for _, k := range classes {
		if k.name == c {
			return true
		}
	}
	return false
}

// FuzzAPIBody sends arbitrary request bodies to every API route that
// decodes one, on the in-memory fake service. Property: the server never
// fails unclassified (no 500); every error is a JSON errorBody with a
// message and a known class, and a body that is not exactly one JSON
// object or null (unknown fields, trailing data, wrong types, over the
// size limit) is refused as invalid before anything happens; a session the
// server reports created exists, under a valid name. The exec stream's
// first frame is decoded as the exec route does: a frame is either one
// whole JSON line of at most maxFrame bytes or an error.
func FuzzAPIBody(f *testing.F) {
	seeds := []struct {
		route int
		body  string
	}{
		{0, `{"name":"a"}`}, {0, `{"name":"a","colour":"red"}`}, {0, `not json`}, {0, `{"name":"a"} {"name":"b"}`},
		{0, `{"name":"Bad Name"}`}, {0, `{"name":"b","cpus":-1,"memory_mib":1e9}`}, {0, `{"name":"c","idle_timeout":"5m"}`},
		{0, `{"name":"d","net":"allow:pypi.org"}`}, {0, `[]`}, {0, `null`}, {0, ``},
		{1, ``}, {1, `{"image":"debian"}`}, {1, `{}x`},
		{2, `{"policy":"open"}`}, {2, `{"policy":"allow:"}`},
		{3, ``}, {3, `{"goal":"x"}`}, {4, `{"status":"done"}`},
		{5, `{"spec":"@every 1m","argv":["true"]}`}, {5, `{"spec":"0 0 30 2 *","argv":["true"]}`},
		{6, `{"name":"c1"}`}, {7, `{"id":"c1"}`}, {8, `{"name":"e","from":"c1"}`},
		{9, `{"name":"mini"}`}, {9, `{"recipe":"/etc/passwd"}`},
		{10, `{"request":{"argv":["echo","hi"]}}` + "\n"}, {10, "\n\n{\"stdin\":\"aGk=\"}\n"}, {10, `{"request":`},
		{10, strings.Repeat(" ", 70000) + "{}\n"},
	}
	for _, s := range seeds {
		f.Add(uint8(s.route), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		if int(route)%(len(fuzzRoutes)+1) == len(fuzzRoutes) {
			checkExecFrame(t, body)
			return
		}
		rt := fuzzRoutes[int(route)%(len(fuzzRoutes)+1)]
		fake := sessiontest.New(sessiontest.Options{})
		defer fake.Close()
		if err := fake.AddSession(session.Session{Name: "demo", State: session.StateRunning, DiskBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		h := NewServer(noImages{fake}, nil, WithVersion("fuzz"))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, rt.method, "http://berth"+rt.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		resp := rec.Result()
		out, _ := io.ReadAll(resp.Body)

		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusInsufficientStorage {
			t.Fatalf("%s %s %q: %d %s", rt.method, rt.path, body, resp.StatusCode, out)
		}
		// Errors are JSON; a build answers with a stream of progress.
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusNoContent && ct != "application/json" &&
			!(resp.StatusCode < 400 && ct == "application/x-ndjson") {
			t.Fatalf("%s %s: Content-Type %q", rt.method, rt.path, ct)
		}
		if resp.StatusCode >= 400 {
			var eb errorBody
			dec := json.NewDecoder(bytes.NewReader(out))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&eb); err != nil || eb.Error == "" || !knownClass(eb.Class) {
				t.Fatalf("%s %s: error %d with body %q", rt.method, rt.path, resp.StatusCode, out)
			}
		}
		trimmed := bytes.TrimSpace(body)
		// JSON's null decodes into a request as {} does: nothing set,
		// nothing dropped.
		oneObject := len(trimmed) > 0 && (trimmed[0] == '{' || string(trimmed) == "null") && json.Valid(trimmed) && len(body) <= maxJSONBody
		accepted := resp.StatusCode < 400
		if accepted && !oneObject && !(rt.optional && len(trimmed) == 0) {
			t.Fatalf("%s %s accepted a body that is not one JSON object: %q → %d %s", rt.method, rt.path, body, resp.StatusCode, out)
		}
		if !oneObject && !(rt.optional && len(trimmed) == 0) && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s %s: body %q answered %d %s; want 400 invalid", rt.method, rt.path, body, resp.StatusCode, out)
		}
		if rt.path == "/v1/sessions" && accepted {
			var s session.Session
			if err := json.Unmarshal(out, &s); err != nil {
				t.Fatalf("create answered %q: %v", out, err)
			}
			if err := session.ValidateName(s.Name); err != nil {
				t.Fatalf("created a session named %q: %v", s.Name, err)
			}
			if _, err := fake.Get(context.Background(), s.Name); err != nil {
				t.Fatalf("created %q, which does not exist: %v", s.Name, err)
			}
		}
	})
}

// checkExecFrame decodes an exec body's first frame.
func checkExecFrame(t *testing.T, body []byte) {
	var first inFrame
	err := newFrameReader(bytes.NewReader(body)).next(&first)
	rest := body
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		if len(bytes.TrimSpace(rest[:i])) > 0 {
			break
		}
		if i+1 > maxFrame { // the reader counts a blank line too
			if !errors.Is(err, errFrameTooLarge) {
				t.Fatalf("a blank line of %d bytes: %v", i+1, err)
			}
			return
		}
		rest = rest[i+1:]
	}
	i := bytes.IndexByte(rest, '\n')
	switch {
	case len(bytes.TrimSpace(rest)) == 0:
		if err != io.EOF {
			t.Fatalf("an empty exec body: %v, want io.EOF", err)
		}
	case i < 0:
		if err != io.ErrUnexpectedEOF && !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("an exec body without a newline: %v", err)
		}
	case i+1 > maxFrame:
		if !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("a frame of %d bytes: %v", i+1, err)
		}
	case json.Valid(rest[:i]):
		var want inFrame
		if json.Unmarshal(rest[:i], &want) == nil && err != nil {
			t.Fatalf("a valid frame %q refused: %v", rest[:i], err)
		}
	default:
		if err == nil {
			t.Fatalf("an invalid frame %q accepted", rest[:i])
		}
	}
}

// FuzzDrainStream: a drain's stream from a daemon (a peer) is read to a
// result, an error or its end, whatever it holds; a result is bounded,
// and only steps reach progress.
func FuzzDrainStream(f *testing.F) {
	for _, s := range []string{
		`{"step":{"session":"a","outcome":"moved","state":"stopped","to":"b","took":1000}}` + "\n" + `{"result":{"host":"h","steps":[]}}` + "\n",
		`{"error":{"error":"host h is gone","class":"invalid state"}}` + "\n",
		`{"step":{"session":"a"}}` + "\n",
		`{"result":{"host":"h","steps":[{},{}]}}`,
		"\n\n{}\n",
		`{"step":`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		steps := 0
		res, err := readDrain(bytes.NewReader(b), func(session.DrainStep) { steps++ })
		if err == nil && len(res.Steps) > maxDrainSteps {
			t.Fatalf("a result of %d steps accepted", len(res.Steps))
		}
		if steps > bytes.Count(b, []byte("\n"))+1 {
			t.Fatalf("%d steps from %d lines", steps, bytes.Count(b, []byte("\n"))+1)
		}
	})
}
