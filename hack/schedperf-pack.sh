#!/usr/bin/env bash
# Packs the scheduler_perf duets for another Linux machine of the same
# architecture: the schedperf test binary, etcd and the device modules,
# built here without symbol tables (about 60 MB gzipped), so that duets can
# run where each side gets several cores of its own.
#
#   hack/schedperf-pack.sh [OUT]     (default _output/schedperf-pack.tar.gz)
#
# On the other machine, from a checkout of the same commit (the test reads
# test/schedperf/templates):
#
#   mkdir -p /tmp/sp && tar -C /tmp/sp -xzf schedperf-pack.tar.gz
#   mkdir -p "$(cat /tmp/sp/apiserver-testdata)"   # the API server writes its test certificates there
#   cd test/schedperf && PATH=/tmp/sp/bin:$PATH KUBEGPU_PLUGIN_DIR=/tmp/sp/plugins \
#     ../../hack/schedperf-duet.sh -t /tmp/sp/bin/schedperf.test -o /tmp/duet -r 2 WholeGPU NoGPU
set -euo pipefail

cd "$(dirname "$0")/.."
out=${1:-_output/schedperf-pack.tar.gz}
go=${GO:-go}
dir=_output/schedperf-pack
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/plugins"
strip=(-ldflags='-s -w')
for p in simgpu nvidia; do
	GOFLAGS=-buildvcs=false "$go" build -tags schedperf -buildmode=plugin "${strip[@]}" -o "$dir/plugins/$p.so" "./plugins/$p/plugin"
done
(cd test/schedperf && GOFLAGS=-buildvcs=false "$go" test -tags schedperf "${strip[@]}" -c -o "../../$dir/bin/schedperf.test" .)
(cd hack/etcd && GOFLAGS= "$go" build "${strip[@]}" -o "../../$dir/bin/etcd" go.etcd.io/etcd/server/v3)
# kube-apiserver's test server writes its self-signed certificates under
# its own package directory in the module cache, which must exist there.
echo "$("$go" list -m -f '{{.Dir}}' k8s.io/kubernetes)/cmd/kube-apiserver/app/testing/testdata" >"$dir/apiserver-testdata"
tar -C "$dir" -cf - bin plugins apiserver-testdata | gzip -6 >"$out"
echo "$out: $(du -h "$out" | cut -f1)"
