# overlay — build, test and run a VXLAN overlay network for container hosts.
# Everything networked that a target does happens in network namespaces it
# creates itself; nothing is configured in the root namespace.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/overlaynet/overlay/internal/version.Version=$(VERSION)
# grpcnotrace: gRPC without golang.org/x/net/trace (its RPC tracing is off
# unless grpc.EnableTracing is set, which nothing here does). That package
# imports html/template, whose reflection keeps the linker from dropping
# unused methods: without it overlayd is 4 MB smaller, and a running
# daemon maps 3.3 MB less of it (Documentation/benchmarks.md, issue 33).
GOTAGS    := grpcnotrace
# make fuzz gives each target a number of executions, about 4 s of fuzzing
# on a 2-core machine (a smoke run that keeps make test within its budget;
# FUZZTIME=5m for a real search), not a duration: with a duration, Go 1.26's fuzz
# coordinator can fail a target with its own deadline ("context deadline
# exceeded", no failing input; golang/go#75804, fixed in Go 1.27). A new
# target needs its count here. FUZZTIME (e.g. 5m, or 10000x) overrides them.
FUZZ_EXECS := FuzzPluginMain=1500 FuzzParseConf=40000 FuzzVerbs=3000 FuzzCorruptCache=750 \
              FuzzParseConfig=100000 FuzzLeaseKeyAndValue=75000 FuzzDecodeAttrsReadsAsMemberByMember=50000 \
              FuzzReplay=100000 FuzzFastDecodingAgreesWithEncodingJSON=15000 \
              FuzzLeaseDataFastAgreesWithEncodingJSON=15000 FuzzLeaseDataReadsAsMemberByMember=50000 \
              FuzzParseReply=60000
FUZZTIME  ?=

.PHONY: all build plugins test test-stress unit e2e runtime-deps runtime-e2e kube kube-deps kube-e2e fuzz layering lint bench scale scale-kube demo demo-down clean deps

all: build plugins

# overlayd-kube is overlayd with kube mode's Kubernetes client linked (build
# tag kube); overlayd hands a command in kube mode over to it, so a host in
# etcd mode maps no client-go (Documentation/design.md, "Two programs").
build:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/overlayd ./cmd/overlayd
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(GOTAGS) kube' -ldflags '$(LDFLAGS)' -o $(BIN)/overlayd-kube ./cmd/overlayd
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(GOTAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/overlay-cni ./cmd/overlay-cni

# The upstream CNI plugins, built from the version pinned by go.mod's tool
# directives (so go.sum records exactly what the tests run).
CNI_PLUGINS := github.com/containernetworking/plugins/plugins/main/bridge \
               github.com/containernetworking/plugins/plugins/ipam/host-local \
               github.com/containernetworking/plugins/plugins/main/loopback \
               github.com/containernetworking/plugins/plugins/meta/portmap

plugins:
	$(GO) build -trimpath -o $(BIN)/cni/ $(CNI_PLUGINS)

test: build plugins unit e2e fuzz

# Everything but the end-to-end tests (those need the binaries: see e2e).
# -parallel 4: the tests marked parallel mostly wait on timers (stall
# checks, TTLs, gRPC keepalive), so more of them than cores run at once.
unit:
	$(GO) test -race -count=1 -parallel 4 -timeout 12m $$($(GO) list ./... | grep -v -e /test/e2e -e /test/faults -e /test/runtime -e /test/kube)
	$(GO) test -race -count=1 -parallel 4 -timeout 5m -tags kube ./cmd/overlayd

# Multi-host tests: real overlayd processes on simulated hosts (network
# namespaces the tests create and delete), a real etcd, pods through libcni.
# It ends with the real container runtimes (runtime-e2e).
e2e: build plugins
	$(GO) test -race -count=1 -p 1 -timeout 12m ./test/e2e/... ./test/faults/...
	$(MAKE) runtime-e2e

# Real container runtimes on two lab hosts: Debian's podman (CNI backend,
# runc) and containerd driven through the Kubernetes CRI, with the test
# image built from busybox-static (nothing is pulled). runtime-deps installs
# the packages with apt when they are missing (test/runtime/install-deps.sh).
runtime-deps:
	@test/runtime/install-deps.sh

runtime-e2e: build plugins runtime-deps
	$(GO) test -race -count=1 -timeout 6m ./test/runtime/...

# The Kubernetes components of the lab (test/kube): kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl and
# the API server's etcd, from the release pinned in test/kube/components
# (a module of its own: the product's go.mod has no Kubernetes dependency),
# cached by version (KUBE_CACHE) and linked into bin/kube. A cold build
# (one go build for all seven) takes 30-45 minutes on 2 busy cores; a
# second run builds nothing.
kube:
	@test/kube/build.sh

# The Kubernetes lab (test/kube, Documentation/kubernetes.md): the control
# plane and three nodes (containerd, kubelet, kube-proxy) in namespaces,
# overlay deployed with deploy/kubernetes/overlay.yaml, then the network
# matrix (IPv4; both families on dual-stack clusters; IPv6-only), printed
# as tables and written to KUBE_MATRIX (JSON). .ci/run runs it after test.
KUBE_MATRIX ?= $(BIN)/kube-matrix.json

kube-deps:
	@test/kube/install-deps.sh

kube-e2e: build plugins kube kube-deps
	KUBE_MATRIX=$(abspath $(KUBE_MATRIX)) $(GO) test -race -count=1 -timeout 15m -v ./test/kube/

# Not part of `make test`: run the suites RUNS times with HOGS busy-loop
# processes beside them and print how often each test failed (a deadline
# that a slow but correct run can hit shows up here, not in CI).
RUNS ?= 5
HOGS ?= 2

test-stress:
	RUNS=$(RUNS) HOGS=$(HOGS) test/stress.sh test

# A short run of every fuzz target (go test -fuzz takes one target at a time).
fuzz:
	@set -e; for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u); do \
	  for f in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    budget="$(FUZZTIME)"; \
	    [ -n "$$budget" ] || budget=$$(echo "$(FUZZ_EXECS)" | tr ' ' '\n' | sed -n "s/^$$f=\([0-9]*\)$$/\1x/p"); \
	    [ -n "$$budget" ] || { echo "make fuzz: $$f has no execution count in FUZZ_EXECS (Makefile)"; exit 1; }; \
	    echo "fuzz $$dir $$f ($$budget)"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$budget $$dir; \
	  done; \
	done

# govulncheck is pinned in go.mod (tool directive). It needs its vulnerability
# database (https://vuln.go.dev, or GOVULNDB=file:///path); without it, lint
# says so and goes on, since the rest of lint works offline.
GOVULNDB ?= https://vuln.go.dev

# The tree's direction (README "Layout"): the binaries never link the
# standard testing package, the test harness or the programs, overlayd links
# no Kubernetes client (overlayd-kube does, build tag kube), the
# leaves in internal/lib import nothing of ours, and the pure lease rules
# (subnet, internal/leaseadmin, the codec picker backend/codecs) and the
# doctor's judgements (internal/doctor: facts in, findings out) link no
# netlink, nftables or prometheus.
layering:
	@# Ours only: client-go's own tools/ are its client's parts (subnet/kube
	@# links rest and tools/cache, not the typed clients), none of them stdlib
	@# testing, which is still refused.
	@bad=$$($(GO) list -deps ./cmd/... | grep -E '^testing$$|^github.com/overlaynet/overlay/(internal/testing|tools)/'); \
	if [ -n "$$bad" ]; then echo "production binaries link test or tool code:"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -deps -tags '$(GOTAGS)' ./cmd/overlayd ./cmd/overlay-cni | grep -E '^k8s.io/|/subnet/kube$$'); \
	if [ -n "$$bad" ]; then echo "overlayd links the Kubernetes client (only overlayd-kube may: build tag kube):"; echo "$$bad"; exit 1; fi
	@bad=$$($(GO) list -f '{{range .Imports}}{{$$.ImportPath}} imports {{.}}{{"\n"}}{{end}}' ./internal/lib/... | grep ' imports github.com/overlaynet/overlay/' | grep -v ' imports github.com/overlaynet/overlay/internal/lib/'); \
	if [ -n "$$bad" ]; then echo "internal/lib must import nothing of ours outside internal/lib:"; echo "$$bad"; exit 1; fi
	@for p in ./subnet ./internal/leaseadmin ./backend/codecs ./internal/doctor; do \
	  bad=$$($(GO) list -deps $$p | grep -E '/vishvananda/netlink|/google/nftables|/prometheus/'); \
	  if [ -n "$$bad" ]; then echo "$$p judges without the kernel and must not link netlink, nftables or prometheus:"; echo "$$bad"; exit 1; fi; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags kube ./cmd/overlayd
	@$(MAKE) --no-print-directory layering
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }
	@out=$$($(GO) tool govulncheck -db $(GOVULNDB) ./... 2>&1); rc=$$?; echo "$$out"; \
	if [ $$rc -ne 0 ] && echo "$$out" | grep -q "fetching vulnerabilities"; then \
	  echo "govulncheck: vulnerability database $(GOVULNDB) unreachable; scan not run"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

# Benchmarks (Documentation/benchmarks.md): namespaces, a real etcd and the
# real binaries, every figure of issue #7 repeated; a table on stdout, JSON
# lines (and a cold-start plot) in bench/results/. The cold starts include
# dual-stack ones at 1000 and 5000 peers, alternated with IPv4-only ones
# (-dual). BENCHFLAGS adds flags, e.g. BENCHFLAGS='-k 100,1000,5000 -runs 3',
# '-only cold,events' or "-dual ''" (no dual-stack runs).
BENCHFLAGS ?=

bench: build plugins
	$(GO) build -o $(BIN)/overlay-bench ./tools/bench
	$(BIN)/overlay-bench -bin $(BIN) -root . $(BENCHFLAGS)

# A 3-host cluster with 2 pods per host in network namespaces: prints the
# leases, routes and pod-to-pod pings, then removes everything. KEEP=1 keeps
# it running in the background until `make demo-down`. DUALSTACK=1 makes the
# network dual stack: IPv4 and IPv6 subnets, routes and pings.
DUALSTACK ?=

demo: build plugins
	@$(GO) build -o $(BIN)/overlay-demo ./tools/demo
	@$(BIN)/overlay-demo -bin $(BIN)$(if $(filter-out 0,$(DUALSTACK)), -dual-stack)

demo-down:
	@$(GO) build -o $(BIN)/overlay-demo ./tools/demo
	@$(BIN)/overlay-demo down

clean:
	rm -rf $(BIN)

# Control plane at N hosts (Documentation/scale.md): N simulated hosts, each
# with its own etcd client and the production lease manager and watch,
# against a real 3-member etcd cluster on loopback (member processes of its
# own). Not part of `make test`. SCALEFLAGS adds flags, e.g.
# SCALEFLAGS='-n 500 -runs 1' for a quick run, or '-n 1000,5000,9000'.
SCALEFLAGS ?=

scale:
	$(GO) build -o $(BIN)/overlay-scale ./tools/scale
	$(BIN)/overlay-scale $(SCALEFLAGS)

# Kube mode's control plane at N hosts (Documentation/scale.md): the same
# simulated hosts running subnet/kube.Source against a kube-apiserver and
# its etcd from `make kube`'s build, on loopback ports. About 20-30 minutes
# at 1,000 hosts with the 8-minute windows; SCALEFLAGS as for scale. Heavy like
# the Kubernetes lab: run it as `flock /tmp/kube-lab.lock make scale-kube`.
scale-kube: kube
	$(GO) build -o $(BIN)/overlay-scale ./tools/scale
	$(BIN)/overlay-scale -source kube -kube-bin $(BIN)/kube -n 100,1000 -runs 3 -steady 8m $(SCALEFLAGS)
