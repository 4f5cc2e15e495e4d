#!/usr/bin/env bash
# Integration checks of the built artefacts: the binaries in _output/bin load
# the device modules in _output/plugins (built by the same make run) and
# report what they find. Prints a "N passed, N failed" summary.
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

# A plugin built with other flags than the host is refused with the fix.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOFLAGS=-buildvcs=false go build -buildmode=plugin -o "$tmp/simgpu.so" ./plugins/simgpu/plugin
want='build setting -trimpath: host true, plugin (unset); rebuild the binaries and the plugins together with "make build plugins"'
check "crishim refuses a mismatched plugin" bash -c "! $BIN/kubegpu-crishim devices --plugin-dir $tmp --plugin-option simgpu.preset=dgx1"

echo "integration: $passed passed, $failed failed"
[ "$failed" = 0 ]
