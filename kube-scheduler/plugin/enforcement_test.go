package plugin

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestEnforcementPolicy: the namespace's label overrides the args'
// default both ways; under Required a node whose GPUs cannot enforce
// slices is refused for good (waiting frees nothing that would help),
// whole GPUs are not affected, and a label of another value keeps the
// pod out rather than falling back to the default.
func TestEnforcementPolicy(t *testing.T) {
	p, node, _ := fullDGX(t, 0) // the test inventory has no slice enforcer
	ni := framework.NewNodeInfo()
	ni.SetNode(node)
	p.namespaces = anyNamespace{labeled: map[string]map[string]string{
		"strict": {kubeinterface.LabelEnforcement: string(types.EnforcementRequired)},
		"lax":    {kubeinterface.LabelEnforcement: string(types.EnforcementBestEffort)},
		"typo":   {kubeinterface.LabelEnforcement: "required"},
	}}
	try := func(ns string, def types.EnforcementPolicy, cores int64) (pre, filter *fwk.Status) {
		t.Helper()
		p.args.Enforcement = def
		pod := gpuPod("p-"+ns, 1, cores, testNow)
		pod.Namespace = ns
		if cores > 0 {
			pod.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPUMemory] = resource.MustParse("4096")
		}
		cs := framework.NewCycleState()
		if _, st := p.PreFilter(context.Background(), cs, pod, nil); !st.IsSuccess() {
			return st, nil
		}
		return nil, p.Filter(context.Background(), cs, pod, ni)
	}
	for _, tt := range []struct {
		ns    string
		def   types.EnforcementPolicy
		cores int64
		fits  bool
	}{
		{"default", types.EnforcementBestEffort, 25, true},
		{"default", types.EnforcementRequired, 25, false},
		{"strict", types.EnforcementBestEffort, 25, false},
		{"lax", types.EnforcementRequired, 25, true},
		{"strict", types.EnforcementRequired, 0, true}, // a whole GPU
	} {
		pre, st := try(tt.ns, tt.def, tt.cores)
		if pre != nil {
			t.Errorf("namespace %s, default %s: PreFilter %v", tt.ns, tt.def, pre)
			continue
		}
		if st.IsSuccess() != tt.fits {
			t.Errorf("namespace %s, default %s, %d%% cores: Filter %v, want fits=%v", tt.ns, tt.def, tt.cores, st, tt.fits)
		}
		if !tt.fits && (st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), devicescheduler.ReasonUnenforced)) {
			t.Errorf("namespace %s, default %s: refusal %v %q, want UnschedulableAndUnresolvable with %q", tt.ns, tt.def, st.Code(), st.Message(), devicescheduler.ReasonUnenforced)
		}
	}
	// A Required slice that names no memory is refused outright.
	p.args.Enforcement = types.EnforcementRequired
	pod := gpuPod("no-memory", 1, 25, testNow)
	if _, st := p.PreFilter(context.Background(), framework.NewCycleState(), pod, nil); st.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(st.Message(), "must set both") {
		t.Errorf("a Required slice without memory: PreFilter %v, want it refused for it", st)
	}
	pre, _ := try("typo", types.EnforcementBestEffort, 25)
	if pre == nil || pre.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(pre.Message(), `"required": want Required or BestEffort`) {
		t.Errorf("namespace label of another value: PreFilter %v, want the pod kept out with what the label may be", pre)
	}
}
