#!/usr/bin/env bash
# Installs a pinned Go tool into _output/tools/bin unless it is already there.
# Usage: hack/tools.sh NAME   (golangci-lint | benchstat | helm | promtool)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/_output/tools/bin"
mkdir -p "$BIN"

declare -A PKG=(
	[golangci-lint]=github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
	[benchstat]=golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
	[helm]=helm.sh/helm/v3/cmd/helm@v3.22.0
	[promtool]=github.com/prometheus/prometheus/cmd/promtool@v0.316.0
)
name=$1
pkg=${PKG[$name]:?unknown tool $name}
stamp="$BIN/.$name.version"
if [ -x "$BIN/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkg" ]; then
	exit 0
fi
echo "tools: installing $pkg (once; a few minutes)" >&2
GOBIN="$BIN" GOFLAGS= go install "$pkg"
echo "$pkg" >"$stamp"
