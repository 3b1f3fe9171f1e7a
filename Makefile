# onehop: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
BIN := bin/onehop
QUICKSTART ?= examples/quickstart.yaml
PORTSHARE ?= examples/portshare.yaml
TAPDEMO ?= examples/tap.yaml

.PHONY: man package install uninstall all deps build generate check-generated lint vet unit-test fuzz e2e-test test demo demo-down demo-portshare demo-tap demo-cloud bench bench-scale clean

all: build

deps:
	@bash scripts/install-deps.sh
	@bash scripts/install-go-tools.sh

# What `onehop version` says (internal/version, docs/operations.md): the
# release (a git tag, else the commit), the commit and the build time.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
VPKG := github.com/onehop/onehop/internal/version
LDFLAGS := -X $(VPKG).Version=$(VERSION) -X $(VPKG).Commit=$(COMMIT) -X $(VPKG).Date=$(DATE)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/onehop

# Rebuild the eBPF objects and their Go bindings from bpf/*.c (needs clang-14).
generate: deps
	$(GO) generate ./...

# The committed objects must be exactly what the C compiles to.
check-generated: generate
	@git diff --exit-code --stat -- '*_bpfel.go' '*_bpfel.o' || \
	  (echo "generated BPF files differ from bpf/*.c: run 'make generate' and commit" >&2; exit 1)

# Static checks at pinned versions: staticcheck through go.mod's tool
# directive, gofmt of the Go that builds, clang-format-14 (install-deps) with
# bpf/.clang-format. bpf/*.c and bpf/lib/*.h only: headers vendored into
# bpf/include/ keep their own style. Generated *_bpfel.go are gofmt-clean
# and stay in the check.
lint: deps
	@$(GO) tool staticcheck ./... || \
	  { echo "lint: staticcheck found the problems above: fix them (go tool staticcheck ./... runs it again)" >&2; exit 1; }
	@bad=$$(git ls-files -z '*.go' | xargs -0 "$$($(GO) env GOROOT)/bin/gofmt" -l); \
	  if [ -n "$$bad" ]; then echo "$$bad" >&2; \
	    echo "lint: the Go files above are not gofmt-formatted: run gofmt -w on them" >&2; exit 1; fi
	@clang-format-14 --dry-run --Werror bpf/*.c bpf/lib/*.h || \
	  { echo "lint: bpf/ is not in bpf/.clang-format's style: run clang-format-14 -i bpf/*.c bpf/lib/*.h, then make generate" >&2; exit 1; }

vet:
	$(GO) vet ./...

# Pure Go tests, then BPF_PROG_RUN tests (root) in the same packages; docs/
# holds the tests that keep README's layout and the demos true to the tree.
unit-test:
	$(GO) test -count=1 ./internal/... ./cmd/... ./bench/... ./docs/...
	@# The per-packet cost benchmarks, run once each: not timed here, but a
	@# benchmark whose frame no longer takes the path it times fails now,
	@# not on the day someone measures with it.
	$(GO) test -count=1 -run '^$$' -bench 'PacketCost|PortspaceCost|TapCost|EgressCost' -benchtime 1x ./internal/datapath/ ./internal/portspace/ ./internal/tap/ ./internal/egress/
	@# A create's cost as hosts fill (100 against 2,000 VMs a host), once each.
	$(GO) test -count=1 -run '^$$' -bench 'CreateVMWithNOnHost|CreatePassWithNOnHost' -benchtime 1x ./internal/controller/ ./internal/agent/

# Every Go fuzz target, briefly (FUZZTIME each): parsers a tenant or an operator can feed.
fuzz:
	@bash scripts/fuzz.sh

# Whole labs of namespaces with real tools; one package at a time.
e2e-test:
	$(GO) test -count=1 -p 1 -timeout 60m ./test/e2e/...

test: deps lint vet check-generated unit-test fuzz e2e-test

demo: deps build
	@bash scripts/demo.sh $(BIN) $(QUICKSTART)

demo-down: build
	$(BIN) lab down --lab quickstart

# Port-space isolation: slivers sharing their host's address, told apart by
# port; builds examples/portshare.yaml, shows it, and tears it down.
demo-portshare: deps build
	@bash scripts/demo-portshare.sh $(BIN) $(PORTSHARE)

# Virtual TAP: copies of what a policy names reach a monitor VM on another
# host; builds examples/tap.yaml, shows the monitor's capture, tears it down.
demo-tap: deps build
	@bash scripts/demo-tap.sh $(BIN) $(TAPDEMO)

# Multipath cloud access (issue 11): user -> gw -> two shaped WANs -> xtr ->
# srv; both paths used, one cut and restored, LISP decoded by tshark.
demo-cloud: deps build
	@bash scripts/demo-cloud.sh $(BIN) examples/cloud-access.yaml

bench: deps build
	$(GO) run ./bench -binary $(BIN) -rounds $${ROUNDS:-5} -out bench/results/latest.json
	@echo; echo "The datapath's own cost per packet (BPF_PROG_RUN, no kernel around it):"
	$(GO) test -count=1 -run '^$$' -bench 'PacketCost|ObserveCost' -benchtime 200000x ./internal/datapath/ | grep ns/packet

# The control plane at issue 12's size (1,000 simulated hosts running the real
# agent, 10,000 VMs): against the embedded etcd, then an external 3-member
# cluster whose leader is killed mid-run. SCALE_ARGS sizes it (e.g.
# SCALE_ARGS='-hosts 100 -vms 1000 -farms 10'); reports land in bench/results/.
bench-scale: deps build
	@mkdir -p bench/results
	$(GO) run ./bench/scale -binary $(BIN) -out bench/results/scale-embedded.json $(SCALE_ARGS)
	$(GO) run ./bench/scale -binary $(BIN) -cluster -out bench/results/scale-cluster.json $(SCALE_ARGS)

# Install the binary, the systemd units (contrib/systemd/, docs/deploy.md)
# and the CNI plugin's link (CNIBINDIR, docs/guests.md).
# PREFIX and DESTDIR as usual; the units' ExecStart is pointed at
# $(PREFIX)/bin. The example env files go to /etc/onehop only where none is
# there yet: an operator's settings are never overwritten.
PREFIX ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
UNITS := onehop-controller.service onehop-agent.service
# Where container runtimes look for CNI plugins.
CNIBINDIR ?= /opt/cni/bin
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/onehop
	install -d -m 0755 $(DESTDIR)$(UNITDIR)
	@for u in $(UNITS); do \
	  sed 's|/usr/local/bin/onehop|$(PREFIX)/bin/onehop|' contrib/systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u && \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u && echo "installed $(DESTDIR)$(UNITDIR)/$$u" || exit 1; \
	done
	install -d -m 0700 $(DESTDIR)$(SYSCONFDIR)/onehop
	@for e in controller.env agent.env; do \
	  if [ -e $(DESTDIR)$(SYSCONFDIR)/onehop/$$e ]; then echo "kept $(DESTDIR)$(SYSCONFDIR)/onehop/$$e"; \
	  else install -m 0600 contrib/systemd/$$e $(DESTDIR)$(SYSCONFDIR)/onehop/$$e && echo "installed $(DESTDIR)$(SYSCONFDIR)/onehop/$$e"; fi; \
	done
	@# The CNI plugin is the binary itself (run with CNI_COMMAND set; docs/guests.md).
	install -d -m 0755 $(DESTDIR)$(CNIBINDIR)
	ln -sfn $(PREFIX)/bin/onehop $(DESTDIR)$(CNIBINDIR)/onehop
	@echo "installed $(DESTDIR)$(CNIBINDIR)/onehop -> $(PREFIX)/bin/onehop (the CNI plugin)"
	@echo "next: edit $(SYSCONFDIR)/onehop/*.env, then systemctl daemon-reload && systemctl enable --now onehop-controller onehop-agent (docs/deploy.md)"

# Removes what install put in place, except /etc/onehop (settings, keys).
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/onehop $(addprefix $(DESTDIR)$(UNITDIR)/,$(UNITS)) $(DESTDIR)$(CNIBINDIR)/onehop

# One man page per command (cobra's generator) into MANDIR. Dated by the
# commit (SOURCE_DATE_EPOCH), not the day: two builds make the same pages.
MANDIR ?= bin/man
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
man: build
	@rm -rf $(MANDIR) && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN) man $(MANDIR) && echo "man pages in $(MANDIR) (man -l $(MANDIR)/onehop.1)"

# A Debian package (dpkg-deb, no network) in PKGDIR: the binary, the man
# pages, bash/zsh/fish completions, the systemd units and example settings
# (conffiles), the CNI plugin's link. docs/operations.md.
PKGDIR ?= bin
package: build
	@bash scripts/package.sh $(BIN) $(VERSION) $(PKGDIR)

clean:
	rm -rf bin
