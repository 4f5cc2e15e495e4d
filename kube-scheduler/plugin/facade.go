package plugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedconfigv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// FacadeName is the stock DynamicResources plugin behind a facade that
// hides kubegpu's ResourceClaims from it (docs/dra.md). A profile enables
// it in place of DynamicResources, whose name cannot be registered twice;
// its args are DynamicResourcesArgs.
const FacadeName = "DynamicResourcesFacade"

// Facade runs the stock DynamicResources plugin on every pod with the
// pod's kubegpu claims (dra.Ours) left out of spec.resourceClaims and
// status.resourceClaimStatuses: those are KubeGPU's to allocate, and the
// stock allocator would take kubegpu's devices first-fit, or find none
// (they carry kubegpu's taint). Claims of other drivers, the cycle state
// (under the stock plugin's own key), events and queueing hints are the
// stock plugin's, unchanged.
type Facade struct {
	inner *dynamicresources.DynamicResources
	// claims are the scheduler's claims (its claim tracker).
	claims claims.Getter
}

var (
	_ fwk.PreEnqueuePlugin         = (*Facade)(nil)
	_ fwk.PreFilterPlugin          = (*Facade)(nil)
	_ fwk.FilterPlugin             = (*Facade)(nil)
	_ fwk.PostFilterPlugin         = (*Facade)(nil)
	_ fwk.PodGroupPostFilterPlugin = (*Facade)(nil)
	_ fwk.ScorePlugin              = (*Facade)(nil)
	_ fwk.ReservePlugin            = (*Facade)(nil)
	_ fwk.PreBindPlugin            = (*Facade)(nil)
	_ fwk.EnqueueExtensions        = (*Facade)(nil)
	_ fwk.SignPlugin               = (*Facade)(nil)
)

// NewFacade builds the stock plugin with the profile's args for it and the
// scheduler's feature gates.
func NewFacade(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := facadeArgs(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", FacadeName, err)
	}
	pl, err := dynamicresources.New(ctx, args, h, feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", FacadeName, err)
	}
	f := &Facade{inner: pl.(*dynamicresources.DynamicResources)}
	if m := h.SharedDRAManager(); m != nil {
		f.claims = m.ResourceClaims()
	}
	return f, nil
}

// facadeArgs decodes DynamicResourcesArgs (kubescheduler.config.k8s.io/v1)
// from the profile, defaulted as the stock plugin's.
func facadeArgs(obj runtime.Object) (*schedconfig.DynamicResourcesArgs, error) {
	var v1 configv1.DynamicResourcesArgs
	if u, ok := obj.(*runtime.Unknown); ok && len(u.Raw) > 0 {
		// Strict: a misspelt field is an error, not a default.
		if err := yaml.UnmarshalStrict(u.Raw, &v1); err != nil {
			return nil, fmt.Errorf("args: %w", err)
		}
	} else if obj != nil {
		if _, ok := obj.(*runtime.Unknown); !ok {
			return nil, fmt.Errorf("args of type %T, want DynamicResourcesArgs", obj)
		}
	}
	schedconfigv1.SetDefaults_DynamicResourcesArgs(&v1)
	var out schedconfig.DynamicResourcesArgs
	if err := schedconfigv1.Convert_v1_DynamicResourcesArgs_To_config_DynamicResourcesArgs(&v1, &out, nil); err != nil {
		return nil, fmt.Errorf("args: %w", err)
	}
	return &out, nil
}

// Name returns the facade's name.
func (*Facade) Name() string { return FacadeName }

// hide returns pod without its kubegpu claims: pod itself when it has
// none. A claim that cannot be read yet, or mixes classes, stays: the
// stock plugin waits for it, and KubeGPU refuses a mixed one.
func (f *Facade) hide(pod *corev1.Pod) *corev1.Pod {
	if len(pod.Spec.ResourceClaims) == 0 || f.claims == nil {
		return pod
	}
	var ours map[string]bool
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name, _, err := resourceclaim.Name(pod, pc)
		if err != nil || name == nil {
			continue
		}
		claim, err := f.claims.Get(pod.Namespace, *name)
		if err != nil {
			continue
		}
		if yes, err := dra.Ours(claim); err == nil && yes {
			if ours == nil {
				ours = map[string]bool{}
			}
			ours[pc.Name] = true
		}
	}
	if ours == nil {
		return pod
	}
	out := *pod
	out.Spec.ResourceClaims = nil
	for _, pc := range pod.Spec.ResourceClaims {
		if !ours[pc.Name] {
			out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, pc)
		}
	}
	out.Status.ResourceClaimStatuses = nil
	for _, st := range pod.Status.ResourceClaimStatuses {
		if !ours[st.Name] {
			out.Status.ResourceClaimStatuses = append(out.Status.ResourceClaimStatuses, st)
		}
	}
	return &out
}

// EventsToRegister is the stock plugin's.
func (f *Facade) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	return f.inner.EventsToRegister(ctx)
}

// SignPod signs the pod without kubegpu's claims.
func (f *Facade) SignPod(ctx context.Context, pod *corev1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return f.inner.SignPod(ctx, f.hide(pod))
}

// PreEnqueue waits for the claims that are not kubegpu's.
func (f *Facade) PreEnqueue(ctx context.Context, pod *corev1.Pod) *fwk.Status {
	return f.inner.PreEnqueue(ctx, f.hide(pod))
}

// PreFilter and the other extension points delegate with the pod
// without kubegpu's claims (see hide).
func (f *Facade) PreFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	return f.inner.PreFilter(ctx, cs, f.hide(pod), nodes)
}

// PreFilterExtensions is the stock plugin's.
func (f *Facade) PreFilterExtensions() fwk.PreFilterExtensions { return f.inner.PreFilterExtensions() }

// Filter delegates (see PreFilter).
func (f *Facade) Filter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	return f.inner.Filter(ctx, cs, f.hide(pod), ni)
}

// PostFilter has nothing to do where the stock plugin's PreFilter did not
// run (a PreFilter before it refused the pod): the stock plugin would
// report its missing state as an error.
func (f *Facade) PostFilter(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, m fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	if _, err := cs.Read(dynamicresources.Name); err != nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	return f.inner.PostFilter(ctx, cs, f.hide(pod), m)
}

// PodGroupPostFilter is the stock plugin's: a pod group's claims are
// the group's, never kubegpu's.
func (f *Facade) PodGroupPostFilter(ctx context.Context, state fwk.PodGroupCycleState, pg fwk.PodGroupInfo, fn fwk.PodGroupSchedulingFunc) (*fwk.PodGroupPostFilterResult, *fwk.Status) {
	return f.inner.PodGroupPostFilter(ctx, state, pg, fn)
}

// Score delegates (see PreFilter).
func (f *Facade) Score(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	return f.inner.Score(ctx, cs, f.hide(pod), ni)
}

// ScoreExtensions is the facade's NormalizeScore.
func (f *Facade) ScoreExtensions() fwk.ScoreExtensions { return f }

// NormalizeScore delegates (see PreFilter).
func (f *Facade) NormalizeScore(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	return f.inner.NormalizeScore(ctx, cs, f.hide(pod), scores)
}

// Reserve delegates (see PreFilter).
func (f *Facade) Reserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	return f.inner.Reserve(ctx, cs, f.hide(pod), node)
}

// Unreserve delegates (see PreFilter).
func (f *Facade) Unreserve(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) {
	f.inner.Unreserve(ctx, cs, f.hide(pod), node)
}

// PreBindPreFlight delegates (see PreFilter).
func (f *Facade) PreBindPreFlight(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) (*fwk.PreBindPreFlightResult, *fwk.Status) {
	return f.inner.PreBindPreFlight(ctx, cs, f.hide(pod), node)
}

// PreBind delegates (see PreFilter).
func (f *Facade) PreBind(ctx context.Context, cs fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	return f.inner.PreBind(ctx, cs, f.hide(pod), node)
}
