#!/usr/bin/env bash
# Integration checks of the built artefacts: the binaries in _output/bin load
# the device modules in _output/plugins (built by the same make run) and
# report what they find. Prints a "N passed, N failed" summary, and appends
# the checks it skipped to the file $KUBEGPU_SKIPS names, if any.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=_output/bin
PLUGINS=_output/plugins
passed=0
failed=0

check() { # name, command..., with the expected output fragment in $want
	local name=$1; shift
	local out
	if out=$("$@" 2>&1) && grep -qF -- "$want" <<<"$out"; then
		echo "--- PASS: $name"
		passed=$((passed + 1))
	else
		echo "--- FAIL: $name: want output containing '$want', got:"
		sed 's/^/    /' <<<"$out"
		failed=$((failed + 1))
	fi
}

want="kubegpu-crishim v"
check "crishim version" $BIN/kubegpu-crishim version

want="gpu0  X     NV1   NV1   NV2   NV2   SYS   SYS   SYS"
check "crishim devices dgx1" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=dgx1

want='"model": "NVIDIA H100 80GB HBM3"'
check "crishim devices dgx-h100 json" $BIN/kubegpu-crishim devices -o json --plugin-dir $PLUGINS \
	--node-name ci --plugin-option simgpu.preset=dgx-h100

# nvidia.so is installed too; without the NVIDIA driver it is skipped, with
# the reason, and the simulated GPUs are shown.
want="Device module has nothing to serve on this node; continuing without it"
check "crishim skips nvidia without NVML" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option nvidia.nvml-library=/nonexistent/libnvidia-ml.so.1
want="Module simgpu: 4 devices"
check "crishim shows simgpu beside a skipped nvidia" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option nvidia.nvml-library=/nonexistent/libnvidia-ml.so.1

# The AMD module on the recorded sysfs trees of an 8-GPU MI300X node and a
# four-MI250 node, beside simulated NVIDIA GPUs: two vendors, each asked
# for with its own resource.
want="Module amd: 8 devices, asked for as amd.com/gpu"
check "crishim devices amd mi300x-8" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option amd.root=$PWD/plugins/amd/testdata/mi300x-8
want="amd0  X      XGMI   XGMI   XGMI2  XGMI2  XGMI2  XGMI   XGMI2"
check "crishim devices amd mi250-4 links" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option amd.root=$PWD/plugins/amd/testdata/mi250-4
want="Module simgpu: 4 devices, asked for as nvidia.com/gpu"
check "crishim devices simgpu beside amd" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option amd.root=$PWD/plugins/amd/testdata/mi250-4

# The Intel module on the recorded DRM trees of four Max 1550 (i915) and two
# Arc B580 (xe): each driver's GPUs asked for with its own resource.
want="Module intel: 4 devices, asked for as gpu.intel.com/i915"
check "crishim devices intel max1550-4" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option intel.root=$PWD/plugins/intel/testdata/max1550-4
want="Intel Arc B580 Graphics"
check "crishim devices intel b580-2" $BIN/kubegpu-crishim devices --plugin-dir $PLUGINS --node-name ci \
	--plugin-option simgpu.preset=t4x4 --plugin-option intel.root=$PWD/plugins/intel/testdata/b580-2

# A plugin built with other flags than the host is refused with the fix.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOFLAGS=-buildvcs=false go build -buildmode=plugin -o "$tmp/simgpu.so" ./plugins/simgpu/plugin
want='build setting -trimpath: host true, plugin (unset); rebuild the binaries and the plugins together with "make build plugins"'
check "crishim refuses a mismatched plugin" bash -c "! $BIN/kubegpu-crishim devices --plugin-dir $tmp --plugin-option simgpu.preset=dgx1"

# The placement simulator on a small trace of its own: JSON fields, a plot,
# and a malformed line reported with file, line and column.
cat >"$tmp/nodes.csv" <<'CSV'
sn,cpu_milli,memory_mib,gpu,model
n0,64000,262144,8,G2
n1,32000,131072,4,T4
n2,32000,131072,0,
CSV
cat >"$tmp/pods.csv" <<'CSV'
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,4000,8192,1,500,
p1,8000,16384,1,1000,G2
p2,16000,32768,4,1000,
p3,2000,4096,1,250,T4
p4,1000,1024,0,0,
CSV
want='"policy":"kubegpu","alloc_at_100":'
check "sim placement json" $BIN/kubegpu-sim placement --nodes "$tmp/nodes.csv" --pods "$tmp/pods.csv" \
	--policies fgd,kubegpu --seeds 2 --json --plot "$tmp/alloc.png"
want="PNG"
check "sim placement plot" head -c 4 "$tmp/alloc.png"
printf 'p5,abc,1,1,1000,\n' >>"$tmp/pods.csv"
want="pods.csv:7:2 (column cpu_milli): want an integer, got \"abc\""
check "sim rejects a malformed trace line" bash -c "! $BIN/kubegpu-sim placement --nodes $tmp/nodes.csv --pods $tmp/pods.csv --seeds 1"

# The demo (make demo), so that it cannot rot: it needs kube-apiserver from
# make kube-binaries and etcd from make deps.
if [ -x $BIN/kube-apiserver ] && [ -x _output/tools/bin/containerd ] && command -v etcd >/dev/null; then
	want="NVIDIA_VISIBLE_DEVICES=GPU-"
	check "make demo" go run ./demo --bin-dir $BIN --plugin-dir $PLUGINS --node-bin-dir _output/tools/bin
else
	echo "--- SKIP: make demo (needs make kube-binaries node-binaries deps)"
	# make test lists it with the tests that skipped.
	[ -z "${KUBEGPU_SKIPS:-}" ] || echo "  hack/test-integration.sh make demo: needs make kube-binaries node-binaries deps" >>"$KUBEGPU_SKIPS"
fi

echo "integration: $passed passed, $failed failed"
[ "$failed" = 0 ]
