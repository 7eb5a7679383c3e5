// Package chfake is a fake Cloud Hypervisor for tests: its REST API on a
// unix socket and its hybrid-vsock muxer, with an in-process "guest".
//
// It follows CH v53.0's observed behaviour where that differs from the
// spec (see shared/notes/cloud-hypervisor.md): requests are handled one at
// a time, errors are 404 only for "VM not created" and 500 for everything
// else (never 405), error bodies are JSON arrays of strings, vm.create
// accepts any JSON and validation happens at vm.boot, vm.shutdown leaves
// the VM Created, vm.snapshot needs Paused, and vm.restore needs a fresh
// VMM. A guest poweroff ends the VMM with status 0. Disks are locked,
// given PCI slots and hot-plugged as disks.go describes.
//
// It runs in-process (New, Serve) or as a process standing in for the
// cloud-hypervisor binary (Main).
package chfake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthvm/berth/vmm/cloudhypervisor/internal/chapi"
)

// Version is what vmm.ping reports.
const Version = "v53.0-chfake"

// Options configure a Server. The zero value is a prompt, well-behaved VMM.
type Options struct {
	// Pid is what vmm.ping reports; zero means os.Getpid().
	Pid int
	// Logf receives what CH would log; nil discards it.
	Logf func(format string, args ...any)
	// Delays make actions slow, e.g. {"vm.boot": time.Second}. Like CH's
	// single API thread, a slow action delays every other request.
	Delays map[string]time.Duration
	// BeforeAction, if set, runs before each action is handled (with the
	// API thread held), e.g. to make the VMM die during vm.boot.
	BeforeAction func(op string)
	// OnRunning, if set, runs when the VM starts running after vm.boot or
	// vm.restore, e.g. to start guest services.
	OnRunning func(s *Server)
}

// Fault is an injected failure for one action.
type Fault struct {
	Status   int      // HTTP status; 0 means 500
	Messages []string // the error body; nil means a generic message
	// After makes the action take effect before the error is sent: CH's
	// status does not prove the action failed, and the driver must read
	// vm.info to find out.
	After bool
}

// Server is a fake CH API server. Its methods are safe for concurrent use.
type Server struct {
	opts Options
	pid  int

	// api is held for the whole of each request: CH's HTTP server is one
	// thread, and every request waits for the VMM loop's answer.
	api sync.Mutex

	mu        sync.Mutex // guards the fields below
	rawConfig json.RawMessage
	config    *chapi.VmConfig
	state     chapi.VmState // "" when no VM is created
	dev       *devices
	guests    map[uint32]func(net.Conn)
	faults    map[string]Fault

	ln       net.Listener
	lockFile *os.File
	srv      *http.Server

	exitOnce sync.Once
	exited   chan struct{}
	exitCode int
}

// New returns a Server that is not yet serving.
func New(opts Options) *Server {
	pid := opts.Pid
	if pid == 0 {
		pid = os.Getpid()
	}
	return &Server{
		opts:   opts,
		pid:    pid,
		guests: make(map[uint32]func(net.Conn)),
		faults: make(map[string]Fault),
		exited: make(chan struct{}),
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// Serve binds the API socket the way CH v53.0 does (lock <path>.lock,
// remove a stale socket, bind) and serves in the background until Close.
func (s *Server) Serve(path string) error {
	lf, err := os.OpenFile(path+".lock", os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("creating API server socket: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(lf.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		lf.Close()
		return fmt.Errorf("API socket %s is in use by another cloud-hypervisor: %w", path, err)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		lf.Close()
		return fmt.Errorf("creating API server socket: %w", err)
	}
	s.mu.Lock()
	s.ln, s.lockFile = ln, lf
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveHTTP)}
	srv := s.srv
	s.mu.Unlock()
	s.logf("API server listening on %s", path)
	// Ends when Close shuts srv down.
	go srv.Serve(ln)
	return nil
}

// Close stops serving, shuts the VM down (releasing its disks and vsock
// socket) and removes the API socket.
func (s *Server) Close() error {
	s.mu.Lock()
	srv, lf := s.srv, s.lockFile
	s.srv, s.lockFile = nil, nil
	dev := s.dev
	s.dev = nil
	s.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Close() // closes the listener, which unlinks the socket
	}
	if lf != nil {
		lf.Close()
	}
	dev.close()
	return err
}

// Exited is closed when the VMM would exit: after vmm.shutdown, or once
// the guest powered off.
func (s *Server) Exited() <-chan struct{} { return s.exited }

// ExitCode is the status the VMM would exit with, once Exited is closed.
func (s *Server) ExitCode() int { return s.exitCode }

func (s *Server) exit(code int) {
	s.exitOnce.Do(func() {
		s.exitCode = code
		close(s.exited)
	})
}

// State is the VM's state as vm.info would report it ("" for no VM).
func (s *Server) State() chapi.VmState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Config is the VM config last given to vm.create or vm.restore.
func (s *Server) Config() (chapi.VmConfig, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.config == nil {
		return chapi.VmConfig{}, false
	}
	return *s.config, true
}

// Listen makes a guest service listen on vsock port: connections to it
// through the hybrid vsock socket are handed to h after the OK line.
func (s *Server) Listen(port uint32, h func(net.Conn)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.guests[port] = h
}

// Unlisten stops the guest service on port.
func (s *Server) Unlisten(port uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.guests, port)
}

func (s *Server) guest(port uint32) func(net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.guests[port]
}

// Inject makes the next call of op fail with f.
func (s *Server) Inject(op string, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[op] = f
}

// PowerOff is the guest powering off: CH tears the VM down and, without
// --no-shutdown, exits with status 0.
func (s *Server) PowerOff() {
	s.mu.Lock()
	dev := s.dev
	s.dev, s.config, s.rawConfig, s.state = nil, nil, nil, ""
	s.mu.Unlock()
	dev.close()
	s.logf("guest powered off; VMM exiting")
	s.exit(0)
}

// apiError is an answer with CH's error body.
type apiError struct {
	status int
	msgs   []string
}

func (e *apiError) Error() string { return strings.Join(e.msgs, ": ") }

func errAPI(status int, msgs ...string) *apiError {
	return &apiError{status: status, msgs: append([]string{"Error from API"}, msgs...)}
}

func notRunning(what string) *apiError {
	return errAPI(http.StatusInternalServerError, what, "VM is not running")
}

// handler handles one action; it runs with s.api held. A nil body and nil
// error give 204.
type handler struct {
	method string
	fn     func(s *Server, body []byte) (any, *apiError)
}

// routes mirrors vmm/src/api/http/mod.rs. Routes the fake does not model
// answer 500, as an unsupported action would.
var routes = map[string]handler{
	"vmm.ping":         {http.MethodGet, (*Server).ping},
	"vmm.shutdown":     {http.MethodPut, (*Server).shutdownVMM},
	"vm.create":        {http.MethodPut, (*Server).create},
	"vm.boot":          {http.MethodPut, (*Server).boot},
	"vm.info":          {http.MethodGet, (*Server).info},
	"vm.pause":         {http.MethodPut, (*Server).pause},
	"vm.resume":        {http.MethodPut, (*Server).resume},
	"vm.shutdown":      {http.MethodPut, (*Server).shutdown},
	"vm.reboot":        {http.MethodPut, (*Server).reboot},
	"vm.power-button":  {http.MethodPut, (*Server).powerButton},
	"vm.delete":        {http.MethodPut, (*Server).delete},
	"vm.counters":      {http.MethodGet, (*Server).counters},
	"vm.snapshot":      {http.MethodPut, (*Server).snapshot},
	"vm.restore":       {http.MethodPut, (*Server).restore},
	"vm.add-device":    {http.MethodPut, unsupported},
	"vm.add-disk":      {http.MethodPut, (*Server).addDisk},
	"vm.add-fs":        {http.MethodPut, unsupported},
	"vm.add-net":       {http.MethodPut, unsupported},
	"vm.add-pmem":      {http.MethodPut, unsupported},
	"vm.add-vsock":     {http.MethodPut, unsupported},
	"vm.add-vdpa":      {http.MethodPut, unsupported},
	"vm.remove-device": {http.MethodPut, unsupported},
	"vm.resize":        {http.MethodPut, unsupported},
	"vm.resize-disk":   {http.MethodPut, unsupported},
	"vm.resize-zone":   {http.MethodPut, unsupported},
	"vm.nmi":           {http.MethodPut, unsupported},
}

func unsupported(*Server, []byte) (any, *apiError) {
	return nil, errAPI(http.StatusInternalServerError, "chfake does not model this action")
}

const apiRoot = "/api/v1/"

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.api.Lock()
	defer s.api.Unlock()

	w.Header().Set("Server", "Cloud Hypervisor API")
	w.Header().Set("Content-Type", "application/json")
	op, ok := strings.CutPrefix(r.URL.Path, apiRoot)
	h, known := routes[op]
	if !ok || !known {
		writeError(w, &apiError{status: http.StatusNotFound, msgs: []string{"Not Found"}})
		return
	}
	if r.Method != h.method {
		// CH answers a wrong method with a bare 400 (never the spec's 405).
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, errAPI(http.StatusBadRequest, err.Error()))
		return
	}
	if s.opts.BeforeAction != nil {
		s.opts.BeforeAction(op)
	}
	if d := s.opts.Delays[op]; d > 0 {
		time.Sleep(d) // the slow action being simulated, holding the API thread
	}

	s.mu.Lock()
	f, faulty := s.faults[op]
	delete(s.faults, op)
	s.mu.Unlock()
	if faulty && !f.After {
		writeError(w, f.apiError(op))
		return
	}
	out, aerr := h.fn(s, body)
	switch {
	case faulty:
		writeError(w, f.apiError(op))
	case aerr != nil:
		s.logf("HTTP API error response: %s", aerr)
		writeError(w, aerr)
	case out == nil:
		w.WriteHeader(http.StatusNoContent)
	default:
		b, _ := json.Marshal(out)
		w.Write(b)
	}
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
	// Actions that end the VMM do so once their answer is on its way.
	if op == "vmm.shutdown" && aerr == nil {
		go s.exit(0)
	}
	if op == "vm.power-button" && aerr == nil {
		go s.PowerOff()
	}
}

func (f Fault) apiError(op string) *apiError {
	st := f.Status
	if st == 0 {
		st = http.StatusInternalServerError
	}
	msgs := f.Messages
	if msgs == nil {
		msgs = []string{"Error from API", "injected failure of " + op}
	}
	return &apiError{status: st, msgs: msgs}
}

func writeError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(e.msgs)
	w.WriteHeader(e.status)
	w.Write(b)
}

func (s *Server) ping([]byte) (any, *apiError) {
	pid := int64(s.pid)
	features := []string{}
	build := Version
	return chapi.VmmPingResponse{Version: Version, BuildVersion: &build, Pid: &pid, Features: &features}, nil
}

func (s *Server) shutdownVMM([]byte) (any, *apiError) {
	s.delete(nil)
	return nil, nil
}

func (s *Server) create(body []byte) (any, *apiError) {
	var cfg chapi.VmConfig
	if err := json.Unmarshal(body, &cfg); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msgs: []string{"Failed to deserialize JSON", err.Error()}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.config != nil {
		return nil, errAPI(http.StatusInternalServerError, "The VM could not be created", "VM is already created")
	}
	// Stored as given: CH validates nothing until vm.boot.
	s.config, s.rawConfig, s.state = &cfg, append(json.RawMessage(nil), body...), chapi.Created
	return nil, nil
}

func (s *Server) boot([]byte) (any, *apiError) {
	s.mu.Lock()
	cfg, state := s.config, s.state
	s.mu.Unlock()
	switch {
	case cfg == nil:
		return nil, errAPI(http.StatusNotFound, "The VM could not boot", "VM is not created")
	case state == chapi.Running || state == chapi.Paused:
		return nil, errAPI(http.StatusInternalServerError, "The VM could not boot", "VM is already created")
	}
	dev, aerr := s.openDevices(*cfg, true, nil, "The VM could not boot")
	if aerr != nil {
		return nil, aerr
	}
	s.mu.Lock()
	s.dev, s.state = dev, chapi.Running
	s.mu.Unlock()
	s.logf("VM booted")
	if s.opts.OnRunning != nil {
		s.opts.OnRunning(s)
	}
	return nil, nil
}

func (s *Server) info([]byte) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.config == nil {
		return nil, errAPI(http.StatusNotFound, "The VM information could not be retrieved", "VM is not created")
	}
	size := int64(512 << 20)
	if s.config.Memory != nil {
		size = s.config.Memory.Size
	}
	var tree map[string]chapi.DeviceNode
	if s.dev != nil {
		tree = s.dev.deviceTree()
	}
	return struct {
		Config           json.RawMessage             `json:"config"`
		State            chapi.VmState               `json:"state"`
		MemoryActualSize int64                       `json:"memory_actual_size"`
		DeviceTree       map[string]chapi.DeviceNode `json:"device_tree,omitempty"`
	}{s.rawConfig, s.state, size, tree}, nil
}

// transition moves a booted VM from one state to another the way CH's
// state machine allows, with CH's errors otherwise.
func (s *Server) transition(what string, from, to chapi.VmState) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case from:
		s.state = to
		return nil
	case chapi.Running, chapi.Paused:
		return errAPI(http.StatusInternalServerError, what,
			fmt.Sprintf("Invalid transition: InvalidStateTransition(%s, %s)", s.state, to))
	default:
		return notRunning(what)
	}
}

func (s *Server) pause([]byte) (any, *apiError) {
	return nil, s.transition("The VM could not be paused", chapi.Running, chapi.Paused)
}

func (s *Server) resume([]byte) (any, *apiError) {
	return nil, s.transition("The VM could not be resumed", chapi.Paused, chapi.Running)
}

// shutdown drops the running VM but keeps its config: vm.info then says
// Created, and vm.boot works again.
func (s *Server) shutdown([]byte) (any, *apiError) {
	s.mu.Lock()
	if s.state != chapi.Running && s.state != chapi.Paused {
		s.mu.Unlock()
		return nil, notRunning("The VM could not shut down")
	}
	dev := s.dev
	s.dev, s.state = nil, chapi.Created
	s.mu.Unlock()
	dev.close()
	return nil, nil
}

func (s *Server) reboot([]byte) (any, *apiError) {
	if st := s.State(); st != chapi.Running && st != chapi.Paused {
		return nil, notRunning("The VM could not reboot")
	}
	return nil, nil
}

func (s *Server) powerButton([]byte) (any, *apiError) {
	if s.State() != chapi.Running {
		return nil, notRunning("The VM could not be powered off")
	}
	return nil, nil // the guest's poweroff follows the answer (serveHTTP)
}

// delete drops VM and config; it answers 204 even when there is nothing.
func (s *Server) delete([]byte) (any, *apiError) {
	s.mu.Lock()
	dev := s.dev
	s.dev, s.config, s.rawConfig, s.state = nil, nil, nil, ""
	s.mu.Unlock()
	dev.close()
	return nil, nil
}

func (s *Server) counters([]byte) (any, *apiError) {
	if st := s.State(); st != chapi.Running && st != chapi.Paused {
		return nil, notRunning("The VM counters could not be retrieved")
	}
	return chapi.VmCounters{}, nil
}

// Files of a snapshot directory, as CH writes them.
const (
	snapConfig = "config.json"
	snapState  = "state.json"
	snapMemory = "memory-ranges"
)

func (s *Server) snapshot(body []byte) (any, *apiError) {
	const what = "The VM could not be snapshotted"
	var req chapi.VmSnapshotConfig
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msgs: []string{"Failed to deserialize JSON", err.Error()}}
	}
	s.mu.Lock()
	state, raw, cfg := s.state, s.rawConfig, s.config
	var slots map[string]uint8
	if s.dev != nil {
		slots = maps.Clone(s.dev.slots)
	}
	s.mu.Unlock()
	switch state {
	case chapi.Paused:
	case chapi.Running:
		return nil, errAPI(http.StatusInternalServerError, what, "Error snapshotting VM", "Trying to snapshot while VM is running")
	default:
		return nil, notRunning(what)
	}
	dir, aerr := fileURLPath(req.DestinationUrl, what)
	if aerr != nil {
		return nil, aerr
	}
	// config.json is created with create_new: a directory that holds a
	// snapshot already is refused.
	f, err := os.OpenFile(filepath.Join(dir, snapConfig), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, errAPI(http.StatusInternalServerError, what, "Error snapshotting VM", err.Error())
	}
	_, werr := f.Write(raw)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		st, _ := json.Marshal(chfakeState{Chfake: true, Slots: slots})
		werr = os.WriteFile(filepath.Join(dir, snapState), st, 0o600)
	}
	if werr == nil {
		size := int64(512 << 20)
		if cfg.Memory != nil {
			size = cfg.Memory.Size
		}
		werr = writeSparse(filepath.Join(dir, snapMemory), size)
	}
	if werr != nil {
		return nil, errAPI(http.StatusInternalServerError, what, "Error snapshotting VM", werr.Error())
	}
	s.logf("snapshot written to %s", dir)
	return nil, nil
}

func writeSparse(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// restore needs a fresh VMM: no VM and no stored config. A failed restore
// leaves none behind.
func (s *Server) restore(body []byte) (any, *apiError) {
	const what = "The VM could not be restored"
	var req chapi.RestoreConfig
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, msgs: []string{"Failed to deserialize JSON", err.Error()}}
	}
	s.mu.Lock()
	fresh := s.config == nil
	s.mu.Unlock()
	if !fresh {
		return nil, errAPI(http.StatusInternalServerError, what, "VM is already created")
	}
	dir, aerr := fileURLPath(&req.SourceUrl, what)
	if aerr != nil {
		return nil, aerr
	}
	raw, err := os.ReadFile(filepath.Join(dir, snapConfig))
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, snapMemory))
	}
	if err != nil {
		return nil, errAPI(http.StatusInternalServerError, what, "Error restoring VM", err.Error())
	}
	var cfg chapi.VmConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, errAPI(http.StatusInternalServerError, what, "Error restoring VM", "Failed to deserialize snapshot config", err.Error())
	}
	var st chfakeState
	if b, err := os.ReadFile(filepath.Join(dir, snapState)); err == nil {
		json.Unmarshal(b, &st)
	}
	dev, aerr := s.openDevices(cfg, false, st.Slots, what)
	if aerr != nil {
		return nil, aerr
	}
	state := chapi.Paused
	if req.Resume != nil && *req.Resume {
		state = chapi.Running
	}
	s.mu.Lock()
	s.config, s.rawConfig, s.dev, s.state = &cfg, raw, dev, state
	s.mu.Unlock()
	s.logf("VM restored from %s (%s)", dir, state)
	if s.opts.OnRunning != nil {
		s.opts.OnRunning(s)
	}
	return nil, nil
}

func fileURLPath(u *string, what string) (string, *apiError) {
	if u == nil {
		return "", errAPI(http.StatusInternalServerError, what, "missing URL")
	}
	p, ok := strings.CutPrefix(*u, "file://")
	if !ok {
		return "", errAPI(http.StatusInternalServerError, what, "Unsupported URL scheme: "+*u)
	}
	return p, nil
}

// devices are what a booted VM holds open on the host, and where its
// devices sit on the guest's PCI bus.
type devices struct {
	disks  []*os.File
	nics   []*os.File
	serial *os.File
	vsock  *muxer
	slots  map[string]uint8 // PCI slot of segment 0 by device id
}

func (d *devices) close() {
	if d == nil {
		return
	}
	for _, f := range d.disks {
		f.Close() // releases its lock
	}
	for _, f := range d.nics {
		f.Close()
	}
	if d.serial != nil {
		d.serial.Close()
	}
	if d.vsock != nil {
		d.vsock.close()
	}
}

// openDevices does what vm.boot (and vm.restore, given the PCI slots its
// snapshot recorded) check and open: the payload (boot only), disks with
// CH's OFD locks, the serial file and the vsock socket, which is bound
// without unlinking a stale file first.
func (s *Server) openDevices(cfg chapi.VmConfig, boot bool, restored map[string]uint8, what string) (_ *devices, aerr *apiError) {
	fail := func(msgs ...string) *apiError {
		return errAPI(http.StatusInternalServerError, append([]string{what}, msgs...)...)
	}
	d := &devices{slots: make(map[string]uint8)}
	defer func() {
		if aerr != nil {
			d.close()
		}
	}()
	if boot {
		p := cfg.Payload
		if p.Kernel == nil && p.Firmware == nil {
			return nil, fail("Error validating configuration", "No kernel or firmware in the payload")
		}
		for _, f := range []*string{p.Kernel, p.Firmware, p.Initramfs} {
			if f == nil {
				continue
			}
			kf, err := os.Open(*f)
			if err != nil {
				return nil, fail("Error booting VM", "Cannot open payload file", err.Error())
			}
			kf.Close()
		}
	}
	var disks []chapi.DiskConfig
	if cfg.Disks != nil {
		disks = *cfg.Disks
	}
	if msgs := validateDisks(disks); msgs != nil {
		return nil, fail(msgs...)
	}
	for i, dc := range disks {
		f, msgs, locked := openDisk(dc)
		if locked {
			return nil, fail(append([]string{"Error locking disk images: Another instance likely holds a lock"}, msgs...)...)
		}
		if msgs != nil {
			return nil, fail(append([]string{"Error from device manager"}, msgs...)...)
		}
		d.disks = append(d.disks, f)
		id := fmt.Sprintf("_disk%d", i)
		if dc.Id != nil {
			id = *dc.Id
		}
		if _, err := d.allocate(id, slotFor(restored, id, dc.PciDeviceId)); err != nil {
			return nil, fail("Error from device manager", "Failed to find an available PCI device ID", err.Error())
		}
	}
	if cfg.Net != nil {
		for i, nc := range *cfg.Net {
			f, msgs := openNIC(nc)
			if msgs != nil {
				return nil, fail(append([]string{"Error from device manager"}, msgs...)...)
			}
			d.nics = append(d.nics, f)
			id := fmt.Sprintf("_net%d", i)
			if nc.Id != nil {
				id = *nc.Id
			}
			if _, err := d.allocate(id, slotFor(restored, id, nc.PciDeviceId)); err != nil {
				return nil, fail("Error from device manager", "Failed to find an available PCI device ID", err.Error())
			}
		}
	}
	if _, err := d.allocate(rngID, slotFor(restored, rngID, nil)); err != nil {
		return nil, fail("Error from device manager", "Failed to find an available PCI device ID", err.Error())
	}
	if cfg.Serial != nil && cfg.Serial.Mode == chapi.ConsoleModeFile && cfg.Serial.File != nil {
		f, err := os.Create(*cfg.Serial.File)
		if err != nil {
			return nil, fail("Error creating serial device", err.Error())
		}
		fmt.Fprintf(f, "chfake: guest console\n")
		d.serial = f
	}
	if cfg.Vsock != nil {
		if cfg.Vsock.Cid < 3 {
			return nil, fail("Error validating configuration", fmt.Sprintf("Invalid vsock CID %d", cfg.Vsock.Cid))
		}
		m, err := listenMuxer(cfg.Vsock.Socket, s)
		if err != nil {
			return nil, fail("Error creating vsock device", err.Error())
		}
		d.vsock = m
		id := vsockID
		if cfg.Vsock.Id != nil {
			id = *cfg.Vsock.Id
		}
		if _, err := d.allocate(id, slotFor(restored, id, cfg.Vsock.PciDeviceId)); err != nil {
			return nil, fail("Error from device manager", "Failed to find an available PCI device ID", err.Error())
		}
	}
	return d, nil
}

var errBadCommand = errors.New("invalid hybrid vsock command")
