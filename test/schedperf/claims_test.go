//go:build schedperf

package schedperf

import (
	"fmt"
	"path/filepath"
	"strings"
)

// claimWorkloads are upstream scheduler_perf's DRA test cases
// (test/integration/scheduler_perf/dra/performance-config.yaml) at 500
// nodes, on kubegpu's devices: each node a DGX-1 whose 8 GPUs are
// published as ResourceSlices of gpu.kubegpu.io, as kubegpu-crishim
// publishes them (upstream: 10 devices of a test driver). kubegpu-scheduler
// allocates the claims of its DeviceClass gpu.kubegpu.io; the stock
// plugins allocate the same requests of a class over the same devices
// (templates/claims/deviceclass-stock.yaml), the claims tolerating
// kubegpu's taint. Where upstream allocates the initial claims directly
// (allocResourceClaims, outside any scheduler, so without kubegpu's
// signature), the initial pods are scheduled instead, before the
// measurement.
var claimWorkloads = []struct {
	name, body string
}{
	// SchedulingWithResourceClaimTemplate/5000pods_500nodes: each pod
	// one GPU through a ResourceClaimTemplate; half of the GPUs taken
	// first, the other half measured.
	{"ClaimTemplate", claimTemplateBody(false)},
	// The same with upstream's "selector" variant: a CEL selector that
	// every device passes, but that must be evaluated.
	{"ClaimTemplateSelector", claimTemplateBody(true)},
	// SchedulingWithResourceClaim/5000pods_500nodes: claims with
	// deterministic names, each shared by five pods.
	{"SharedClaim", sharedClaimBody},
}

// claimTemplateBody is the workload of SchedulingWithResourceClaimTemplate:
// 2,000 pods first, then 2,000 measured, filling the 4,000 GPUs.
func claimTemplateBody(selector bool) string {
	params := "{className: {{class}}, tolerate: {{tolerate}}}"
	if selector {
		params = `{className: {{class}}, tolerate: {{tolerate}}, selectors: [{cel: {expression: 'device.attributes["gpu.kubegpu.io"].index >= 0 && device.capacity["gpu.kubegpu.io"].memory.isGreaterThan(quantity("1Mi"))'}}]}`
	}
	return `  - opcode: createAny
    templatePath: {{templates}}/claims/resourceclaimtemplate.yaml
    namespace: init
    templateParams: ` + params + `
  - opcode: createPods
    namespace: init
    countParam: $initPods
    podTemplatePath: {{templates}}/claims/pod-with-claim-template.yaml
  - opcode: createAny
    templatePath: {{templates}}/claims/resourceclaimtemplate.yaml
    namespace: test
    templateParams: ` + params + `
  - opcode: createPods
    namespace: test
    countParam: $measurePods
    podTemplatePath: {{templates}}/claims/pod-with-claim-template.yaml
    collectMetrics: true
  workloads:
  - name: 500Nodes
    labels: [performance, short]
    params: {nodes: 500, initPods: 2000, measurePods: 2000}
`
}

// sharedClaimBody is the workload of SchedulingWithResourceClaim: 500
// claims and 2,500 pods first, then 500 claims and 2,500 pods measured.
const sharedClaimBody = `  - opcode: createAny
    templatePath: {{templates}}/claims/resourceclaim.yaml
    namespace: init
    countParam: $initClaims
    templateParams: {className: {{class}}, tolerate: {{tolerate}}}
  - opcode: createPods
    namespace: init
    countParam: $initPods
    podTemplatePath: {{templates}}/claims/pod-with-claim-ref.yaml
  - opcode: createAny
    templatePath: {{templates}}/claims/resourceclaim.yaml
    namespace: test
    countParam: $measureClaims
    templateParams: {className: {{class}}, tolerate: {{tolerate}}}
  - opcode: createPods
    namespace: test
    countParam: $measurePods
    podTemplatePath: {{templates}}/claims/pod-with-claim-ref.yaml
    collectMetrics: true
  workloads:
  - name: 500Nodes
    labels: [performance, short]
    params: {nodes: 500, initClaims: 500, initPods: 2500, measureClaims: 500, measurePods: 2500}
`

// stockClass is the stock test cases' DeviceClass
// (templates/claims/deviceclass-stock.yaml).
const stockClass = "gpu-stock.schedperf.kubegpu.io"

// writeClaimCase writes the workload of a claim test case after its name
// and scheduler lines: the nodes, the DeviceClass of the scheduler (kubegpu's
// shipped one, or stockClass), and the workload's own operations.
func writeClaimCase(b *strings.Builder, templates string, stock bool, body string) error {
	class, tolerate := "gpu.kubegpu.io", "false"
	classFile, err := filepath.Abs("../../deploy/dra/kubegpu-deviceclass.yaml")
	if err != nil {
		return err
	}
	if stock {
		class, tolerate, classFile = stockClass, "true", filepath.Join(templates, "claims/deviceclass-stock.yaml")
	}
	// The feature gate on makes the harness run the resourceclaim
	// controller, which creates the claims of templates (as upstream's DRA
	// test cases set it).
	fmt.Fprintf(b, `  featureGates:
    DynamicResourceAllocation: true
  workloadTemplate:
  - opcode: createNodes
    countParam: $nodes
    nodeTemplatePath: %s/node.yaml
  - opcode: createAny
    templatePath: %s
`, templates, classFile)
	b.WriteString(strings.NewReplacer("{{templates}}", templates, "{{class}}", class, "{{tolerate}}", tolerate).Replace(body))
	return nil
}

// claimCase reports whether the test case named name (e.g.
// BenchmarkPerfScheduling/KubeGPU_ClaimTemplate/500Nodes) allocates
// ResourceClaims: its nodes publish ResourceSlices.
func claimCase(name string) bool {
	_, rest, _ := strings.Cut(name, "/")
	_, w, _ := strings.Cut(rest, "_")
	w, _, _ = strings.Cut(w, "/")
	for _, cw := range claimWorkloads {
		if cw.name == w {
			return true
		}
	}
	return false
}
