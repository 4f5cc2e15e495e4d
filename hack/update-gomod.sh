#!/usr/bin/env bash
# Pins the Kubernetes version of the whole module: k8s.io/kubernetes and its
# staging modules (k8s.io/api, client-go, ...), which k8s.io/kubernetes
# requires as v0.0.0 and so need a replace line each. This script is the one
# place that owns those lines.
#
# Usage: hack/update-gomod.sh [KUBERNETES_VERSION]   (default: v1.37.2)
set -euo pipefail

VERSION=${1:-v1.37.2}
STAGING_VERSION="v0.${VERSION#v1.}"
cd "$(dirname "$0")/.."

# The staging modules are the replace lines of k8s.io/kubernetes's own go.mod.
gomod=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@${VERSION}" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -n "$gomod" ] || { echo "update-gomod: cannot download k8s.io/kubernetes@${VERSION}" >&2; exit 1; }
mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' "$gomod")
[ "${#staging[@]}" -gt 0 ] || { echo "update-gomod: no staging modules in $gomod" >&2; exit 1; }

args=()
for m in "${staging[@]}"; do
	args+=("-replace=${m}=${m}@${STAGING_VERSION}")
done
go mod edit "${args[@]}"
# Require k8s.io/kubernetes only where the module imports it (kube-scheduler/);
# go mod tidy drops an unused requirement and keeps the replace lines.
go mod edit "-require=k8s.io/kubernetes@${VERSION}"
GOFLAGS=-mod=mod go mod tidy
echo "update-gomod: pinned k8s.io/kubernetes ${VERSION} and ${#staging[@]} staging modules at ${STAGING_VERSION}"
