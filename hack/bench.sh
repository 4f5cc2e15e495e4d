#!/usr/bin/env bash
# Runs the benchmarks COUNT times each and summarises them with benchstat.
# Usage: hack/bench.sh [COUNT]   (default 6). Raw results: _output/bench.txt
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-6}
hack/tools.sh benchstat
mkdir -p _output
go test -run '^$' -bench . -benchmem -count "$count" ./... | tee _output/bench.txt | grep -E '^(Benchmark|ok|FAIL|---)' || true
echo
_output/tools/bin/benchstat _output/bench.txt
