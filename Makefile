# berth: `make run` opens the TUI on a fresh machine, `make test` runs every
# test (real VMs under TCG included). Both install what they need first.

GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
# Debian packages the tests and the VMs need. The guest kernel is not among
# them: berth fetches it with `apt-get download` and never installs it.
APT_PKGS := qemu-system-x86 qemu-utils e2fsprogs busybox-static openssh-client tmux mmdebstrap sshfs rsync git fuse3 xfsprogs btrfs-progs podman buildah musl-tools
APT_BINS := qemu-system-x86_64 qemu-img mkfs.ext4 busybox ssh sftp tmux mmdebstrap sshfs rsync git mkfs.xfs mkfs.btrfs podman buildah musl-gcc

.PHONY: all build deps image run test bench vet fuzz soak clean install

all: build

# deps installs the Debian packages once; later runs only check.
deps:
	@missing=""; for b in $(APT_BINS); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && ldd /bin/busybox 2>&1 | grep -q 'not a dynamic' || missing="$$missing busybox-static"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages (missing:$$missing)"; \
		if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PKGS) >/dev/null; \
	elif ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then \
		echo "refreshing apt's package lists (the guest kernel comes from them)"; \
		if [ "$$(id -u)" != 0 ]; then SUDO=sudo; fi; $$SUDO apt-get update -qq; \
	fi

build:
	$(GO) build -o $(BIN)/berth .
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/berth-host ./ui/app/cmd/berth-host
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X main.build=$(VERSION)' -o $(BIN)/berth-agent ./guest/cmd/berth-agent
	$(GO) build -o $(BIN)/berth-etcd ./session/fleet/member/cmd/berth-etcd

image: deps build
	$(BIN)/berth image build mini

run: image
	$(BIN)/berth

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# The suite boots real VMs (TCG here); packages run two at a time. Every
# test binary is built with the lock-order checker (-tags lockcheck: see
# the engine's package doc, session/engine); its lock stress test runs once more under
# the race detector. The engine's end-to-end tests are most of the suite's
# time in one package: its Debian tests and the lock churn (ENGINE_APART)
# run in a second process beside the rest, so both cores stay busy to the
# end; their output follows the rest's.
ENGINE_APART := ^(TestLockChurnVMs|TestDebianSystemDisk|TestReplace|TestRecipe|TestNetDebian|TestRecipeNet|TestSSHRsyncGit|TestHarnessEndToEnd|TestExportEndToEnd)$$
test: deps build vet
	@log=$$(mktemp); \
	$(GO) test -count=1 -timeout 25m -tags lockcheck -run '$(ENGINE_APART)' ./session/engine/ >$$log 2>&1 & apart=$$!; \
	$(GO) test -count=1 -timeout 25m -tags lockcheck -skip '$(ENGINE_APART)' ./...; rc=$$?; \
	wait $$apart; rc2=$$?; \
	echo "== session/engine, $(ENGINE_APART) (run beside the rest):"; cat $$log; rm -f $$log; \
	test $$rc = 0 && test $$rc2 = 0
	$(GO) test -count=1 -timeout 5m -race -tags lockcheck -run 'TestLockStress' ./session/engine/

bench: deps build
	BERTH_BENCH=1 $(GO) test -count=1 -p 1 -timeout 40m -run 'TestBench' -v ./... 2>&1 | grep -E 'BENCH|^(--- FAIL|FAIL)' || true
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./ui/ ./ui/components/output/ 2>&1 | grep -E 'Benchmark|ok' || true
	$(GO) test -run '^$$' -bench . ./store/ 2>&1 | grep -E 'Benchmark|ok' || true

# install puts berth, berth-host and the guest agent side by side (berth
# finds berth-host, and the daemon the agent, next to itself) and the shell
# completion scripts where bash, zsh and fish look for them.
PREFIX ?= /usr/local
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0755 $(BIN)/berth $(BIN)/berth-host $(BIN)/berth-agent $(BIN)/berth-etcd $(DESTDIR)$(PREFIX)/bin/
	$(BIN)/berth completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/berth
	$(BIN)/berth completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_berth
	$(BIN)/berth completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/berth.fish

# fuzz runs every fuzz target for FUZZTIME, one after another (go test
# fuzzes one target per invocation). Their seed corpora (f.Add and
# testdata/fuzz) already run as plain tests in `make test`. A failure
# counts only when go wrote a failing input: go1.26's coordinator can end
# a run at the deadline with a bare "context deadline exceeded"
# (golang/go#75804) when a loaded machine starves its worker.
FUZZTIME     ?= 30s
FUZZPARALLEL ?= 1
FUZZ_TARGETS := \
	guest:FuzzFrames guest:FuzzHostHandshake guest:FuzzGuestHandshake guest/tree:FuzzUnpack \
	ui/sshd/sftp:FuzzSFTP ui/sshd:FuzzSCPSink \
	session/engine/egress:FuzzDNSQuery session/engine/egress:FuzzEgressRequest session:FuzzParsePolicy session/schedule:FuzzParseSpec \
	session:FuzzParseCheckpointRef session:FuzzValidateUser guest/users:FuzzLookup \
	session/api:FuzzAPIBody guest/image:FuzzRecipe \
	guest/image/oci:FuzzParseJSON guest/image/oci:FuzzParseEntry guest/image/oci:FuzzApplyLayer guest/image/ext4:FuzzRead \
	ui/common:FuzzSanitizeLine ui/components/output:FuzzOutputWindow \
	guest/agent:FuzzFanotifyEvents session/engine/netstack:FuzzNetstackFrames

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=./$${t%%:*}; name=$${t##*:}; log=$$(mktemp); \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		{ $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -parallel $(FUZZPARALLEL) $$pkg; echo $$? >$$log.rc; } 2>&1 | tee $$log; \
		rc=$$(cat $$log.rc); \
		if [ "$$rc" != 0 ]; then \
			if grep -q 'Failing input written' $$log || ! grep -q 'context deadline exceeded' $$log; then rm -f $$log $$log.rc; exit 1; fi; \
			echo "$$name: no failing input, only go's fuzztime deadline race (golang/go#75804): going on"; \
		fi; \
		rm -f $$log $$log.rc; \
	done

# soak runs ui/app's TestSoak for SOAKTIME: 8 sessions on real VMs under
# a seeded random mix of operations while the daemon (built with -race
# and the lock-order checker) is killed with SIGKILL and restarted and its
# data directory's filesystem fills and empties, then checks every
# invariant. It prints its seed; SOAKSEED=N replays one. make test runs
# the same soak for about a minute.
SOAKTIME ?= 10m
SOAKSEED ?=
soak: deps build
	BERTH_SOAK_TIME=$(SOAKTIME) BERTH_SOAK_SEED=$(SOAKSEED) $(GO) test -count=1 -race -timeout 0 -run '^TestSoak$$' -v ./ui/app/

clean:
	rm -rf $(BIN)

# The fleet's record parsers (host, allocation and owner records read back
# from etcd), fuzzed by make fuzz with the others.
FUZZ_TARGETS += session/fleet:FuzzRecords
