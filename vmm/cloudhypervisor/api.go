package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// apiBase is the API root. The host part is never resolved: every request
// goes through the VM's unix socket.
const apiBase = "http://localhost/api/v1"

// maxCallTime bounds one API call whose context has no deadline. CH answers
// on a single thread, so a wedged VMM would otherwise hang the caller;
// the bound is generous because vm.snapshot writes all guest RAM.
const maxCallTime = 2 * time.Minute

// errNoVM reports that the VMM holds no VM (vm.info answered 404).
var errNoVM = errors.New("no VM is created in this cloud-hypervisor")

// APIError is a non-2xx answer from the Cloud Hypervisor API.
//
// Status is reported as sent, but it does not say what went wrong: v53.0
// answers 500 for a wrong state as for an I/O failure, and never sends the
// 405 its spec documents. Callers read vm.info before deciding what
// happened; the driver does that for every VM method.
type APIError struct {
	Op       string   // the API action, e.g. "vm.pause"
	Status   int      // the HTTP status code
	Messages []string // CH's error chain, outermost first
}

func (e *APIError) Error() string {
	msg := strings.Join(e.Messages, ": ")
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("cloud-hypervisor %s: %s (HTTP %d)", e.Op, msg, e.Status)
}

// Limits on an error body: CH is a host process, but a log line or an
// error message must stay readable whatever it sends.
const (
	maxErrorMessages   = 16
	maxErrorMessageLen = 1024
)

// parseErrorBody turns CH's error body, a JSON array of strings that the
// spec does not describe, into messages. Anything else becomes a single
// message holding the (trimmed) text.
func parseErrorBody(body []byte) []string {
	var msgs []string
	if err := json.Unmarshal(body, &msgs); err != nil {
		text := strings.TrimSpace(string(body))
		if text == "" {
			return nil
		}
		msgs = []string{text}
	}
	if len(msgs) > maxErrorMessages {
		msgs = msgs[:maxErrorMessages]
	}
	for i, m := range msgs {
		if len(m) > maxErrorMessageLen {
			msgs[i] = m[:maxErrorMessageLen] + "…"
		}
	}
	return msgs
}

// apiClient is the hand-written layer over the generated client: unix
// socket transport, error bodies turned into *APIError, and JSON decoded
// whatever Content-Type the answer claims.
type apiClient struct {
	socket string
	c      *chapi.ClientWithResponses
}

func newAPIClient(socket string) *apiClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		// One connection per request. net/http does not retry a PUT on a
		// pooled connection the server has since closed, so keep-alive
		// would turn an idle timeout into a spurious action failure.
		DisableKeepAlives: true,
	}
	c, err := chapi.NewClientWithResponses(apiBase, chapi.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		// Only a malformed server URL fails, and apiBase is a constant.
		panic(fmt.Sprintf("cloudhypervisor: generated client: %v", err))
	}
	return &apiClient{socket: socket, c: c}
}

// response is what every generated *XxxResponse offers.
type response interface {
	StatusCode() int
	GetBody() []byte
}

// check turns a generated call's outcome into an error: transport errors
// are wrapped with the action, non-2xx answers become *APIError.
func check(op string, rsp response, err error) error {
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s: %w", op, err)
	}
	if s := rsp.StatusCode(); s < 200 || s > 299 {
		return &APIError{Op: op, Status: s, Messages: parseErrorBody(rsp.GetBody())}
	}
	return nil
}

// callCtx applies maxCallTime when ctx has no deadline of its own.
func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, maxCallTime)
}

func (a *apiClient) ping(ctx context.Context) (chapi.VmmPingResponse, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	var out chapi.VmmPingResponse
	rsp, err := a.c.GetVmmPingWithResponse(ctx)
	if err := check("vmm.ping", rsp, err); err != nil {
		return out, err
	}
	if err := json.Unmarshal(rsp.Body, &out); err != nil {
		return out, fmt.Errorf("cloud-hypervisor vmm.ping: malformed answer: %w", err)
	}
	return out, nil
}

// info reads vm.info. A 404 (no VM created) yields an error wrapping errNoVM.
func (a *apiClient) info(ctx context.Context) (chapi.VmInfo, error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	var out chapi.VmInfo
	rsp, err := a.c.GetVmInfoWithResponse(ctx)
	if err := check("vm.info", rsp, err); err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return out, fmt.Errorf("%w: %w", errNoVM, err)
		}
		return out, err
	}
	// Decoded here rather than through JSON200, which the generated code
	// fills only when the Content-Type says JSON.
	if err := json.Unmarshal(rsp.Body, &out); err != nil {
		return out, fmt.Errorf("cloud-hypervisor vm.info: malformed answer: %w", err)
	}
	return out, nil
}

func (a *apiClient) create(ctx context.Context, cfg chapi.VmConfig) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.CreateVMWithResponse(ctx, cfg)
	return check("vm.create", rsp, err)
}

func (a *apiClient) boot(ctx context.Context) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.BootVMWithResponse(ctx)
	return check("vm.boot", rsp, err)
}

func (a *apiClient) pause(ctx context.Context) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.PauseVMWithResponse(ctx)
	return check("vm.pause", rsp, err)
}

func (a *apiClient) resume(ctx context.Context) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.ResumeVMWithResponse(ctx)
	return check("vm.resume", rsp, err)
}

func (a *apiClient) shutdownVMM(ctx context.Context) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.ShutdownVMMWithResponse(ctx)
	return check("vmm.shutdown", rsp, err)
}

func (a *apiClient) powerButton(ctx context.Context) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.PowerButtonVMWithResponse(ctx)
	return check("vm.power-button", rsp, err)
}

func (a *apiClient) snapshot(ctx context.Context, dir string) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	url := fileURL(dir)
	rsp, err := a.c.PutVmSnapshotWithResponse(ctx, chapi.VmSnapshotConfig{DestinationUrl: &url})
	return check("vm.snapshot", rsp, err)
}

func (a *apiClient) restore(ctx context.Context, dir string, resume bool) error {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.PutVmRestoreWithResponse(ctx, chapi.RestoreConfig{SourceUrl: fileURL(dir), Resume: &resume})
	return check("vm.restore", rsp, err)
}

// addDisk hot-plugs a disk. CH answers 200 with the disk's PCI address
// when the VM is booted (hot is true), and 204 when it only added the
// disk to the config of a VM that is not booted.
func (a *apiClient) addDisk(ctx context.Context, dc chapi.DiskConfig) (info chapi.PciDeviceInfo, hot bool, err error) {
	ctx, cancel := callCtx(ctx)
	defer cancel()
	rsp, err := a.c.PutVmAddDiskWithResponse(ctx, dc)
	if err := check("vm.add-disk", rsp, err); err != nil {
		return info, false, err
	}
	if rsp.StatusCode() == http.StatusNoContent {
		return info, false, nil
	}
	if err := json.Unmarshal(rsp.Body, &info); err != nil {
		return info, true, fmt.Errorf("cloud-hypervisor vm.add-disk: malformed answer: %w", err)
	}
	return info, true, nil
}

// fileURL is the form CH's snapshot and restore take. CH strips the
// "file://" prefix and uses the rest as a path, without percent-decoding,
// so the path is not escaped here either.
func fileURL(dir string) string { return "file://" + dir }

// stateAfter is the rule for every failed action: read vm.info before
// deciding what happened, because the status code does not say. It returns
// the VM's state, or an error wrapping errNoVM when the VMM holds no VM.
func (a *apiClient) stateAfter(ctx context.Context) (chapi.VmState, error) {
	info, err := a.info(ctx)
	if err != nil {
		return "", err
	}
	return info.State, nil
}
