#!/usr/bin/env bash
# Generates the deep copy, conversion and defaulting functions of the
# KubeGPU plugin's args (kube-scheduler/apis/config and its v1) with
# k8s.io/code-generator at the version go.mod pins. With --verify, checks
# that the generated files in the tree are what it generates, and leaves
# them as they were.
set -euo pipefail
cd "$(dirname "$0")/.."

# code-generator is released with apimachinery, at the same version.
version=$(GOFLAGS= go list -m -f '{{.Version}}' k8s.io/apimachinery)
if [ -z "$version" ]; then
	echo "update-codegen: go.mod pins no k8s.io/apimachinery" >&2
	exit 1
fi
apis=kube-scheduler/apis/config
generated() { find "$apis" -name 'zz_generated.*.go' | sort; }

saved=$(mktemp -d)
trap 'rm -rf "$saved"' EXIT
if [ "${1:-}" = --verify ]; then
	if [ -z "$(generated)" ]; then
		echo "update-codegen: no generated files in $apis: run make generate" >&2
		exit 1
	fi
	tar -cf "$saved/before.tar" $(generated)
	# Whatever happens below (a generator failing, offline, interrupted),
	# leave the tree as it was.
	trap 'generated | xargs -r rm -f; tar -xf "$saved/before.tar"; rm -rf "$saved"' EXIT
fi

generated | xargs -r rm -f
gen() {
	local tool=$1
	shift
	GOFLAGS= go run "k8s.io/code-generator/cmd/$tool@$version" --go-header-file hack/boilerplate.go.txt "$@"
}
gen deepcopy-gen --output-file zz_generated.deepcopy.go "./$apis" "./$apis/v1"
gen defaulter-gen --output-file zz_generated.defaults.go "./$apis/v1"
gen conversion-gen --output-file zz_generated.conversion.go "./$apis/v1"

if [ "${1:-}" != --verify ]; then
	exit 0
fi
mkdir "$saved/before"
tar -xf "$saved/before.tar" -C "$saved/before"
status=0
for f in $(generated); do
	if ! cmp -s "$f" "$saved/before/$f"; then
		echo "update-codegen: $f is not what k8s.io/code-generator $version generates: run make generate" >&2
		diff -u "$saved/before/$f" "$f" | head -40 >&2 || true
		status=1
	fi
done
for f in $(cd "$saved/before" && find . -name 'zz_generated.*.go'); do
	[ -e "$f" ] || { echo "update-codegen: $f is no longer generated: run make generate" >&2; status=1; }
done
exit $status # the trap leaves the tree as it was
