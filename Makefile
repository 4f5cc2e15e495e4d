# kubegpu's front door. `make help` lists the targets.
#
# Host binaries and device-module plugins must be built by the same toolchain
# with the same flags, or the plugins do not load: every go command here runs
# with the GOFLAGS and CGO_ENABLED below, tests included.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
OUT := _output
BIN := $(OUT)/bin
PLUGIN_DIR := $(OUT)/plugins
TOOLS := $(CURDIR)/$(OUT)/tools/bin

export CGO_ENABLED := 1
# go-nvml's cgo preamble uses NVML calls its header marks deprecated.
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
export GOFLAGS := -trimpath -buildvcs=false
export PATH := $(TOOLS):$(PATH)

VERSION ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || echo "v0.0.0-$$(git rev-parse --short HEAD 2>/dev/null || echo dev)")
LDFLAGS := -X github.com/kubegpu/kubegpu/utils/version.gitVersion=$(VERSION)
# The Kubernetes release the scheduler embeds, and its upstream binaries
# (kube-apiserver for the tests and the demo, stock kube-scheduler for the
# benchmark): the version go.mod pins.
KUBE_VERSION := $(shell sed -n 's/^[[:space:]]*k8s.io\/kubernetes v\(.*\)$$/v\1/p' go.mod | head -1)
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(KUBE_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean

# Host binaries: name -> main package.
BINARIES := kubegpu kubegpu-crishim kubegpu-scheduler kubegpu-sim
kubegpu_PKG := ./cli/cmd/kubegpu
kubegpu-crishim_PKG := ./crishim/cmd/kubegpu-crishim
kubegpu-scheduler_PKG := ./kube-scheduler/cmd/kubegpu-scheduler
kubegpu-sim_PKG := ./cli/cmd/kubegpu-sim

# Device modules: name -> the .so's main package.
PLUGINS := simgpu nvidia amd intel
simgpu_PKG := ./plugins/simgpu/plugin
nvidia_PKG := ./plugins/nvidia/plugin
amd_PKG := ./plugins/amd/plugin
intel_PKG := ./plugins/intel/plugin

OPENB ?= $(abspath ../shared/data/openb)
SIM_PODS ?= openb_pod_list_default.csv
SIM_SEEDS ?= 10
SIM_POLICIES ?= random,dotproduct,gpuclustering,gpupacking,bestfit,fgd,kubegpu,kubegpu-online
BENCH_COUNT ?= 6
SCHED_MEMORY_NODES ?= 50
SCHED_MEMORY_PODS ?= 10000
GOTEST_FLAGS ?=
FUZZTIME ?= 30s

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install what building and testing need (Debian packages, Go tools)
	@hack/install-deps.sh

.PHONY: build
build: deps ## Build the binaries into _output/bin
	@mkdir -p $(BIN)
	$(foreach b,$(BINARIES),$(GO) build -ldflags '$(LDFLAGS) $(KUBE_LDFLAGS)' -o $(BIN)/$(b) $($(b)_PKG) &&) true
	ln -sf kubegpu $(BIN)/kubectl-kubegpu

# Upstream binaries, built from the pinned k8s.io/kubernetes (go.mod's tool lines).
KUBE_BINARIES := kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl

.PHONY: kube-binaries
kube-binaries: deps ## Build upstream kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl of the pinned version
	@mkdir -p $(BIN)
	$(foreach b,$(KUBE_BINARIES),$(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $(BIN)/$(b) k8s.io/kubernetes/cmd/$(b) &&) true

# A local container node (internal/localnode) for the CRI shim's tests:
# containerd v2.4.2 with CDI, ctr, crictl and critest v1.34.0, and the
# loopback registry critest pulls from, built into _output/tools/bin.
NODE_BIN := $(TOOLS)

.PHONY: node-binaries
node-binaries: deps ## Build containerd 2.4.2, ctr, crictl, critest into _output/tools/bin (once)
	@hack/node-binaries.sh

.PHONY: node-test
node-test: node-binaries ## Run pods on a real containerd: images, CDI, restart, clean stop (root)
	KUBEGPU_NODE_BIN_DIR=$(NODE_BIN) $(GO) test $(GOTEST_FLAGS) -count=1 -v ./internal/localnode/

# critest (test/critest) against a local containerd, or against
# CRITEST_ENDPOINT (e.g. the shim's socket) in front of a containerd whose
# registry config directory is CRITEST_CONTAINERD_HOSTS (a localnode's
# Dir/certs.d: mirror mode), or else whose socket is CRITEST_CONTAINERD
# (prefix mode). CRITEST_ARGS go to critest (e.g. --ginkgo.focus=Streaming).
CRITEST_ENDPOINT ?=
CRITEST_CONTAINERD_HOSTS ?=
CRITEST_CONTAINERD ?=
CRITEST_IMAGE_MODE ?= auto
CRITEST_ARGS ?=

.PHONY: critest
critest: node-binaries build plugins ## CRI validation (critest, ~2 min each): containerd directly, then through kubegpu-crishim; pass/fail counts
ifeq ($(CRITEST_ENDPOINT),)
	$(GO) run ./test/critest --bin-dir $(NODE_BIN) --out $(OUT)/critest/direct --image-mode $(CRITEST_IMAGE_MODE) \
		$(if $(CRITEST_ARGS),-- $(CRITEST_ARGS)) | tee $(OUT)/critest-direct.txt
	$(GO) run ./test/critest --bin-dir $(NODE_BIN) --out $(OUT)/critest/shim --image-mode $(CRITEST_IMAGE_MODE) \
		--shim $(BIN)/kubegpu-crishim --shim-plugin-dir $(PLUGIN_DIR) \
		$(if $(CRITEST_ARGS),-- $(CRITEST_ARGS)) | tee $(OUT)/critest-shim.txt
	@echo "critest summary:"; grep -h "^critest: [0-9]* passed" $(OUT)/critest-direct.txt $(OUT)/critest-shim.txt
else
	$(GO) run ./test/critest --bin-dir $(NODE_BIN) --out $(OUT)/critest --image-mode $(CRITEST_IMAGE_MODE) \
		--endpoint $(CRITEST_ENDPOINT) \
		$(if $(CRITEST_CONTAINERD_HOSTS),--containerd-hosts-dir $(CRITEST_CONTAINERD_HOSTS)) \
		$(if $(CRITEST_CONTAINERD),--containerd-address $(CRITEST_CONTAINERD)) \
		$(if $(CRITEST_ARGS),-- $(CRITEST_ARGS))
endif

.PHONY: plugins
plugins: deps ## Build the device modules into _output/plugins/*.so
	@mkdir -p $(PLUGIN_DIR)
	$(foreach p,$(PLUGINS),$(GO) build -buildmode=plugin -o $(PLUGIN_DIR)/$(p).so $($(p)_PKG) &&) true

# Container images, built by hack/image (its own module) with no base image:
# the binary, the device modules of the same build for the scheduler, the
# shared libraries they need, a non-root user, no shell. Each is a tar of an
# OCI image layout (`ctr images import`) with docker-save's manifest.json
# (`docker load`, `crane push`), the same digest either way; the same commit
# gives the same digests on machines with the same glibc (the libraries are
# the build machine's). SOURCE_DATE_EPOCH defaults to the commit's time.
IMAGE_REPO ?= ghcr.io/kubegpu
IMAGE_DIR := $(OUT)/images
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_LABELS = -label org.opencontainers.image.version=$(VERSION) -label org.opencontainers.image.source=https://github.com/kubegpu/kubegpu

.PHONY: image
image: build plugins ## Build OCI images of kubegpu-scheduler and the kubegpu CLI into _output/images (IMAGE_REPO)
	@mkdir -p $(IMAGE_DIR)
	cd hack/image && GOFLAGS=-trimpath $(GO) build -o $(TOOLS)/kubegpu-image .
	$(TOOLS)/kubegpu-image -created $(SOURCE_DATE_EPOCH) $(IMAGE_LABELS) \
		-ref $(IMAGE_REPO)/kubegpu-scheduler:$(VERSION) -out $(IMAGE_DIR)/kubegpu-scheduler.tar \
		-entrypoint /usr/local/bin/kubegpu-scheduler -add $(BIN)/kubegpu-scheduler=/usr/local/bin/kubegpu-scheduler \
		$(foreach p,$(PLUGINS),-add $(PLUGIN_DIR)/$(p).so=/usr/lib/kubegpu/plugins/$(p).so) >$(IMAGE_DIR)/kubegpu-scheduler.ref
	$(TOOLS)/kubegpu-image -created $(SOURCE_DATE_EPOCH) $(IMAGE_LABELS) \
		-ref $(IMAGE_REPO)/kubegpu:$(VERSION) -out $(IMAGE_DIR)/kubegpu.tar \
		-entrypoint /usr/local/bin/kubegpu -add $(BIN)/kubegpu=/usr/local/bin/kubegpu >$(IMAGE_DIR)/kubegpu.ref
	@cat $(IMAGE_DIR)/*.ref

# go test runs print through hack/testreport: what go test prints (every
# line with GOTEST_FLAGS=-v), and the tests that skipped, with their
# reasons, kept in $(SKIPS)/TARGET.txt for make test to list at its end.
# go test's exit status stays the verdict (pipefail).
SKIPS := $(CURDIR)/$(OUT)/test-skips
REPORT = testreport -trim github.com/kubegpu/kubegpu/ $(if $(filter -v,$(GOTEST_FLAGS)),-v) -skips $(SKIPS)/$@.txt

$(TOOLS)/testreport: $(filter-out %_test.go,$(wildcard hack/testreport/*.go))
	@mkdir -p $(@D)
	$(GO) build -o $@ ./hack/testreport

.PHONY: test
test: unit integration ## Run every test: unit, fuzz seed corpora, integration; then list the tests that skipped
	@skipped=$$(cat $(SKIPS)/unit.txt $(SKIPS)/integration.txt 2>/dev/null); \
	if [ -z "$$skipped" ]; then echo "Skipped tests: none"; else echo "Skipped tests ($$(wc -l <<<"$$skipped")):"; echo "$$skipped"; fi

.PHONY: unit
unit: deps $(TOOLS)/testreport ## Run unit tests and the fuzz seed corpora
	@mkdir -p $(SKIPS) && rm -f $(SKIPS)/$@.txt
	KUBEGPU_OPENB=$(OPENB) $(GO) test -json $(GOTEST_FLAGS) ./... | $(REPORT)
	cd hack/image && GOFLAGS=-trimpath $(GO) test -json $(GOTEST_FLAGS) ./... | $(REPORT)
	cd hack/dashboard && GOFLAGS=-trimpath $(GO) test -json $(GOTEST_FLAGS) ./... | $(REPORT)
	hack/tools.sh promtool
	cd deploy/prometheus && $(TOOLS)/promtool check rules kubegpu-alerts.yaml && $(TOOLS)/promtool test rules kubegpu-alerts_test.yaml

.PHONY: integration
integration: build plugins kube-binaries node-binaries image $(TOOLS)/testreport ## The built binaries against a real etcd + kube-apiserver, containerd and kubelet
	@mkdir -p $(SKIPS) && rm -f $(SKIPS)/$@.txt
	KUBEGPU_SKIPS=$(SKIPS)/$@.txt hack/test-integration.sh
	hack/tools.sh helm
	KUBEGPU_BIN_DIR=$(CURDIR)/$(BIN) KUBEGPU_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) KUBEGPU_NODE_BIN_DIR=$(NODE_BIN) \
		KUBEGPU_IMAGE_DIR=$(CURDIR)/$(IMAGE_DIR) \
		$(GO) test -json $(GOTEST_FLAGS) -count=1 -timeout 20m ./test/integration/ ./internal/localnode/ ./test/replay/ 2>&1 | \
		$(REPORT) -v | grep -E '^(=== RUN|--- |PASS|FAIL|ok|SKIP|panic)|_test.go|integration:' 

.PHONY: test-nvidia-hardware
test-nvidia-hardware: ## On a node with NVIDIA GPUs, as root (Go and gcc only): the nvidia module against the real driver, nvidia-smi, and MPS slices proven with CUDA clients (not part of test)
	PATH="$$PATH:/usr/local/nvidia/bin" KUBEGPU_NVML_HARDWARE=1 $(GO) test -count=1 -v -run '^TestHardware' ./plugins/nvidia/

.PHONY: generate
generate: ## Regenerate the scheduler plugin's args code (deep copy, conversion, defaults) with k8s.io/code-generator
	@hack/update-codegen.sh

.PHONY: dashboard
dashboard: ## Regenerate deploy/grafana/kubegpu.json from hack/dashboard
	cd hack/dashboard && GOFLAGS=-trimpath $(GO) run . -out ../../deploy/grafana/kubegpu.json

.PHONY: fuzz
fuzz: deps ## Fuzz every decoder for FUZZTIME each (default 30s)
	@hack/fuzz.sh $(FUZZTIME)

.PHONY: bench
bench: deps ## Run the benchmarks (BENCH_COUNT runs each, compared with benchstat)
	@hack/bench.sh $(BENCH_COUNT)

SCHED_NODES ?= 1000
SCHED_ROUNDS ?= 3

.PHONY: bench-scheduler
bench-scheduler: build plugins kube-binaries ## Scheduling throughput, kubegpu-scheduler vs stock kube-scheduler (SCHED_NODES, SCHED_ROUNDS)
	$(GO) run ./test/schedbench --bin-dir $(BIN) --plugin-dir $(PLUGIN_DIR) --nodes $(SCHED_NODES) --rounds $(SCHED_ROUNDS)

REPLAY_PODS ?= openb_pod_list_default.csv
REPLAY_SEED ?= 1
REPLAY_SCHEDULERS ?= kubegpu,stock

.PHONY: bench-replay
bench-replay: build plugins kube-binaries ## Replay the openb trace through the real kubegpu-scheduler beside the simulator (OPENB, REPLAY_PODS, REPLAY_SEED, REPLAY_SCHEDULERS=kubegpu,kubegpu-claims,stock-claims for ResourceClaims)
	$(GO) run ./test/replay --bin-dir $(BIN) --plugin-dir $(PLUGIN_DIR) --openb $(OPENB) --pods $(REPLAY_PODS) --seed $(REPLAY_SEED) --schedulers $(REPLAY_SCHEDULERS)

# Upstream's scheduler_perf harness with the KubeGPU plugin registered out
# of tree, beside the stock plugins on the same workloads (test/schedperf).
# The in-process API server finds its test files by absolute path, so the
# test and its device modules are built without -trimpath, apart from
# _output/plugins, and with the tag schedperf, the test's as well (the
# plugins must match it); its etcd listens on a unix socket, so it runs
# etcd 3.7 (hack/etcd), not Debian's 3.4.
SCHEDPERF := $(OUT)/schedperf
SCHEDPERF_BENCH ?= .*/5000Nodes
SCHEDPERF_FILTER ?= performance
SCHEDPERF_ROUNDS ?= 4
SCHEDPERF_GPU_METRICS ?= PerModel

.PHONY: schedperf-build
schedperf-build: deps
	@mkdir -p $(SCHEDPERF)/bin $(SCHEDPERF)/plugins
	cd hack/etcd && GOFLAGS= $(GO) build -o $(CURDIR)/$(SCHEDPERF)/bin/etcd go.etcd.io/etcd/server/v3
	$(foreach p,$(PLUGINS),GOFLAGS=-buildvcs=false $(GO) build -tags schedperf -buildmode=plugin -o $(SCHEDPERF)/plugins/$(p).so $($(p)_PKG) &&) true
	cd test/schedperf && GOFLAGS=-buildvcs=false $(GO) test -tags schedperf -c -o $(CURDIR)/$(SCHEDPERF)/bin/schedperf.test .

.PHONY: bench-schedperf
bench-schedperf: schedperf-build ## Upstream scheduler_perf, kubegpu vs stock plugins, interleaved rounds (SCHEDPERF_BENCH='.*/500Nodes' SCHEDPERF_FILTER=short for 500 nodes, SCHEDPERF_ROUNDS, SCHEDPERF_GPU_METRICS=PerGPU)
	rm -f $(SCHEDPERF)/round-*.txt
	cd test/schedperf && for r in $$(seq $(SCHEDPERF_ROUNDS)); do \
		PATH=$(CURDIR)/$(SCHEDPERF)/bin:$$PATH KUBEGPU_PLUGIN_DIR=$(CURDIR)/$(SCHEDPERF)/plugins KUBEGPU_SCHEDPERF_STOCK_FIRST=$$((1 - r % 2)) KUBEGPU_SCHEDPERF_GPU_METRICS=$(SCHEDPERF_GPU_METRICS) \
		$(CURDIR)/$(SCHEDPERF)/bin/schedperf.test -test.run '^$$' -test.bench 'BenchmarkPerfScheduling/$(SCHEDPERF_BENCH)' -test.benchtime 1x -test.timeout 180m \
			-perf-scheduling-label-filter=$(SCHEDPERF_FILTER) -data-items-dir=$(CURDIR)/$(SCHEDPERF) >$(CURDIR)/$(SCHEDPERF)/round-$$r.txt 2>&1 || exit 1; \
		grep -E '^Benchmark' $(CURDIR)/$(SCHEDPERF)/round-$$r.txt | awk -v r=$$r '{for (i = 1; i < NF; i++) if ($$(i+1) == "SchedulingThroughput/Average") print "round", r, $$1, $$i, "pods/s"}'; \
	done
	@hack/schedperf-summary.sh $(SCHEDPERF)/round-*.txt

# The same test cases in duets: kubegpu's and the stock scheduler's side by
# side, each on half of the CPUs, so that both see the machine's drift
# (hack/schedperf-duet.sh). SCHEDPERF_DUET_A=Control: stock against stock.
SCHEDPERF_WORKLOADS ?= WholeGPU Topology4GPU Slices NoGPU
SCHEDPERF_NODES ?= 5000Nodes
SCHEDPERF_DUET_A ?= KubeGPU

.PHONY: bench-schedperf-duet
bench-schedperf-duet: schedperf-build ## scheduler_perf in duets, kubegpu and stock side by side on half the CPUs each (SCHEDPERF_ROUNDS, SCHEDPERF_WORKLOADS, SCHEDPERF_NODES=500Nodes SCHEDPERF_FILTER=short, SCHEDPERF_DUET_A=Control; upstream's DRA cases: SCHEDPERF_WORKLOADS="ClaimTemplate ClaimTemplateSelector SharedClaim" with 500Nodes)
	cd test/schedperf && PATH=$(CURDIR)/$(SCHEDPERF)/bin:$$PATH KUBEGPU_PLUGIN_DIR=$(CURDIR)/$(SCHEDPERF)/plugins KUBEGPU_SCHEDPERF_GPU_METRICS=$(SCHEDPERF_GPU_METRICS) \
		$(CURDIR)/hack/schedperf-duet.sh -t $(CURDIR)/$(SCHEDPERF)/bin/schedperf.test -o $(CURDIR)/$(SCHEDPERF)/duet -r $(SCHEDPERF_ROUNDS) \
			-n $(SCHEDPERF_NODES) -l $(SCHEDPERF_FILTER) -a $(SCHEDPERF_DUET_A) $(SCHEDPERF_WORKLOADS)

.PHONY: schedperf-pack
schedperf-pack: deps ## Pack the duets' binaries, without symbol tables, for a machine with more cores (see hack/schedperf-pack.sh)
	GO=$(GO) hack/schedperf-pack.sh

.PHONY: bench-scheduler-memory
bench-scheduler-memory: build plugins kube-binaries ## kubegpu-scheduler's heap across 10,000 adversarial pods created and deleted (SCHED_MEMORY_NODES, SCHED_MEMORY_PODS)
	$(GO) run ./test/schedbench --bin-dir $(BIN) --plugin-dir $(PLUGIN_DIR) --nodes $(SCHED_MEMORY_NODES) --adversarial-pods $(SCHED_MEMORY_PODS)

.PHONY: sim
sim: build ## Replay the openb trace under every policy (OPENB=dir, SIM_PODS=file, SIM_SEEDS=n, SIM_POLICIES=list)
	$(BIN)/kubegpu-sim placement --nodes $(OPENB)/openb_node_list_gpu_node.csv \
		--pods $(OPENB)/$(SIM_PODS) --policies $(SIM_POLICIES) --seeds $(SIM_SEEDS) --plot $(OUT)/sim-$(basename $(SIM_PODS)).png

.PHONY: verify
verify: deps ## gofmt, go vet, go mod tidy diff, generated code, docs/architecture.md, golangci-lint
	@hack/verify.sh

# The soak (test/soak): a cluster under churn and injected faults for
# SOAK_DURATION, checked all along by an independent checker; the report
# goes to _output/soak (report.json, soak.png). Root, as the real node
# needs it.
SOAK_DURATION ?= 60m
SOAK_SEED ?= 1
SOAK_NODES ?= 150

.PHONY: soak
soak: build plugins kube-binaries node-binaries ## A year in an hour: churn from the openb trace and injected faults, checked for double allocation, leaks and stuck pods (SOAK_DURATION, SOAK_SEED, SOAK_NODES, OPENB)
	hack/tools.sh helm
	$(GO) run ./test/soak --bin-dir $(BIN) --plugin-dir $(PLUGIN_DIR) --node-bin-dir $(NODE_BIN) --openb $(OPENB) \
		--duration $(SOAK_DURATION) --seed $(SOAK_SEED) --nodes $(SOAK_NODES) --out $(OUT)/soak

KEEP ?=

.PHONY: demo
demo: build plugins kube-binaries node-binaries ## Run kubegpu end to end: simulated GPU nodes and a real kubelet/containerd node (KEEP=1 leaves it running)
	$(GO) run ./demo --bin-dir $(BIN) --plugin-dir $(PLUGIN_DIR) --node-bin-dir $(NODE_BIN) $(if $(KEEP),--keep)

.PHONY: clean
clean: ## Remove _output
	rm -rf $(OUT)
