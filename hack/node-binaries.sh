#!/usr/bin/env bash
# Builds the binaries of a local container node into _output/tools/bin, each
# only when it is missing or was built from other pins (a stamp file beside
# it records what it was built from):
#
#   containerd, containerd-shim-runc-v2, ctr   containerd v2.4.2 (CDI support)
#   crictl, critest                            cri-tools v1.34.0
#   loopback-registry                          serves test images to critest
#
# containerd is installed straight from the module proxy. cri-tools is not
# (the proxy serves only v1.34.0 and its go.mod fails checksum verification),
# so crictl, critest and loopback-registry are built from the scratch module
# hack/node-tools, which pins them apart from kubegpu's go.mod.
#
# Usage: hack/node-binaries.sh [NAME...]   (default: all of them)
# internal/localnode and make critest use them (KUBEGPU_NODE_BIN_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="$ROOT/_output/tools/bin"
mkdir -p "$BIN"

CONTAINERD_MODULE=github.com/containerd/containerd/v2
CONTAINERD_VERSION=v2.4.2
CONTAINERD_TAGS=no_btrfs
NODE_TOOLS="$ROOT/hack/node-tools"
CRI_TOOLS_VERSION=$(sed -n 's/^[[:space:]]*sigs.k8s.io\/cri-tools v\(.*\)$/\1/p' "$NODE_TOOLS/go.mod" | head -1)
CRI_TOOLS_LDFLAGS="-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"

# What each binary is built from; a change rebuilds it.
containerd_pin() { echo "$CONTAINERD_MODULE@$CONTAINERD_VERSION tags=$CONTAINERD_TAGS"; }
node_tools_pin() {
	echo "$CRI_TOOLS_LDFLAGS" | cat - "$NODE_TOOLS/go.mod" "$NODE_TOOLS/go.sum" "$NODE_TOOLS"/loopback-registry/*.go | sha256sum | cut -c1-16
}

current() { # name pin: is $BIN/name built from pin?
	[ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]
}
stamp() { echo "$2" >"$BIN/.$1.version"; }

timed() { # name command...
	local name=$1 start=$SECONDS
	shift
	echo "node-binaries: building $name" >&2
	"$@"
	echo "node-binaries: built $name in $((SECONDS - start)) s" >&2
}

build_containerd() {
	local pin names=() n
	pin=$(containerd_pin)
	for n in containerd containerd-shim-runc-v2 ctr; do
		current "$n" "$pin" || names+=("$n")
	done
	[ ${#names[@]} -gt 0 ] || return 0
	local pkgs=()
	for n in "${names[@]}"; do pkgs+=("$CONTAINERD_MODULE/cmd/$n@$CONTAINERD_VERSION"); done
	timed "${names[*]} ($CONTAINERD_VERSION)" env GOBIN="$BIN" go install -tags "$CONTAINERD_TAGS" "${pkgs[@]}"
	for n in "${names[@]}"; do stamp "$n" "$pin"; done
}

build_node_tool() { # name
	local name=$1 pin
	pin=$(node_tools_pin)
	current "$name" "$pin" && return 0
	local tmp="$BIN/.$name.tmp"
	case $name in
	crictl) timed "crictl (cri-tools v$CRI_TOOLS_VERSION)" go -C "$NODE_TOOLS" build -ldflags "$CRI_TOOLS_LDFLAGS" -o "$tmp" sigs.k8s.io/cri-tools/cmd/crictl ;;
	critest) timed "critest (cri-tools v$CRI_TOOLS_VERSION)" go -C "$NODE_TOOLS" test -c -ldflags "$CRI_TOOLS_LDFLAGS" -o "$tmp" sigs.k8s.io/cri-tools/cmd/critest ;;
	loopback-registry) timed loopback-registry go -C "$NODE_TOOLS" build -o "$tmp" ./loopback-registry ;;
	esac
	mv "$tmp" "$BIN/$name"
	stamp "$name" "$pin"
}

# The scratch module's go.sum is committed; the proxy's cri-tools go.mod
# does not match the checksum database, so only cri-tools skips it.
export GONOSUMDB=sigs.k8s.io/cri-tools${GONOSUMDB:+,$GONOSUMDB}
export GOFLAGS="${GOFLAGS:--trimpath -buildvcs=false} -mod=readonly"

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(containerd crictl critest loopback-registry)
for name in "${names[@]}"; do
	case $name in
	containerd | containerd-shim-runc-v2 | ctr) build_containerd ;;
	crictl | critest | loopback-registry) build_node_tool "$name" ;;
	*)
		echo "node-binaries: unknown binary $name (want containerd, ctr, containerd-shim-runc-v2, crictl, critest or loopback-registry)" >&2
		exit 2
		;;
	esac
done
