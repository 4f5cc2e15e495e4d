#!/usr/bin/env bash
# Runs every Fuzz* test in the module with the coverage-guided fuzzer for a
# while each. (make test runs their seed corpora; this explores further.)
# Usage: hack/fuzz.sh [DURATION]   (default 30s)
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-30s}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "fuzz: $pkg $f ($time)"
		go test "$pkg" -run '^$' -fuzz "^${f}\$" -fuzztime "$time"
	done
done
