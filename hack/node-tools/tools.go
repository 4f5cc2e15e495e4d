//go:build tools

// Package tools pins the node test tools this module builds: crictl and
// critest from cri-tools (critest is cri-tools' test binary, built with
// go test -c, so its test-only imports are pinned here).
package tools

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
