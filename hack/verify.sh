#!/usr/bin/env bash
# Static checks: gofmt, go vet, go mod tidy, generated code, the
# architecture page, golangci-lint.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0

echo "verify: gofmt"
unformatted=$(git ls-files --cached --others --exclude-standard '*.go' | xargs -r gofmt -l)
if [ -n "$unformatted" ]; then
	echo "gofmt would change (run gofmt -w):"; echo "$unformatted" | sed 's/^/  /'; fail=1
fi

echo "verify: go vet"
go vet ./... || fail=1
go vet -tags schedperf ./test/schedperf || fail=1
(cd hack/image && GOFLAGS=-trimpath go vet ./...) || fail=1
(cd hack/dashboard && GOFLAGS=-trimpath go vet ./...) || fail=1

echo "verify: go mod tidy"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp go.mod go.sum "$tmp/"
go mod tidy
if ! diff -u "$tmp/go.mod" go.mod || ! diff -u "$tmp/go.sum" go.sum; then
	echo "go.mod/go.sum are not tidy: run go mod tidy (hack/update-gomod.sh for the Kubernetes pin)"
	cp "$tmp/go.mod" "$tmp/go.sum" .
	fail=1
fi

echo "verify: generated code (make generate)"
hack/update-codegen.sh --verify || fail=1

echo "verify: docs/architecture.md (docs/architecture.sh -w)"
docs/architecture.sh || fail=1

echo "verify: golangci-lint"
hack/tools.sh golangci-lint
_output/tools/bin/golangci-lint run ./... || fail=1

if [ "$fail" != 0 ]; then
	echo "verify: FAILED"
	exit 1
fi
echo "verify: OK"
