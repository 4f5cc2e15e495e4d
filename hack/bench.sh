#!/usr/bin/env bash
# Runs the benchmarks COUNT times each and summarises them with benchstat,
# with sub-benchmarks named policy=... set side by side against the first
# (the baseline) as ratios.
# Usage: hack/bench.sh [COUNT]   (default 6). Raw results: _output/bench.txt
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-6}
hack/tools.sh benchstat
mkdir -p _output
go test -run '^$' -bench . -benchmem -count "$count" ./... | tee _output/bench.txt | grep -E '^(Benchmark|ok|FAIL|---)' || true
echo
_output/tools/bin/benchstat -col /policy _output/bench.txt
