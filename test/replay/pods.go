package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/tracepods"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// mode is how a replay's pods ask for their GPUs.
type mode int

const (
	// annotations: kubegpu's resources (kubegpu.io/gpu, gpu-cores) and
	// model annotation.
	annotations mode = iota
	// nodeTotals: the stock scheduler's extended resource and a model
	// label (stockPodOf).
	nodeTotals
	// claimsKubegpu: a ResourceClaim of kubegpu's DeviceClass, which
	// kubegpu-scheduler allocates.
	claimsKubegpu
	// claimsStock: a ResourceClaim of stockClass over the same devices,
	// tolerating kubegpu's taint, which the stock DynamicResources plugin
	// allocates (first fit).
	claimsStock
)

func (m mode) claims() bool { return m == claimsKubegpu || m == claimsStock }

// replayer is one scheduler replayed, and how its pods ask for GPUs.
type replayer struct {
	name   string
	binary string
	mode   mode
}

// replayers are the -schedulers a replay knows.
var replayers = map[string]replayer{
	"kubegpu":        {"kubegpu-scheduler", "kubegpu-scheduler", annotations},
	"stock":          {"kube-scheduler (GPUs as node totals)", "kube-scheduler", nodeTotals},
	"kubegpu-claims": {"kubegpu-scheduler (ResourceClaims)", "kubegpu-scheduler", claimsKubegpu},
	"stock-claims":   {"kube-scheduler (ResourceClaims, DynamicResources)", "kube-scheduler", claimsStock},
}

// stockClass selects kubegpu's devices for the stock DynamicResources
// plugin, as dra.ClassName does for kubegpu-scheduler.
const stockClass = "gpu-stock.replay.kubegpu.io"

// createClasses creates kubegpu's shipped DeviceClass and stockClass.
func createClasses(ctx context.Context, c *localcluster.Cluster) error {
	if err := c.Apply(ctx, filepath.Join(repoRoot(), "deploy/dra/kubegpu-deviceclass.yaml")); err != nil {
		return err
	}
	_, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: stockClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: dra.ClassSelector}}}}}, metav1.CreateOptions{})
	return err
}

// Resources the stock scheduler is given GPUs as.
const (
	stockGPUMilli = "alibabacloud.com/gpu-milli"
	stockModel    = "nvidia.com/gpu.product"
)

// podOf is the pod a trace line asks for, in mode m, and the claim it
// uses (claim modes, with GPUs).
func podOf(p *sim.PodSpec, m mode) (*corev1.Pod, *resourceapi.ResourceClaim) {
	pod := tracepods.Host(p, strings.ToLower(p.Name))
	pod.Spec.NodeSelector = map[string]string{nodeLabel: "true"}
	if p.NumGPU == 0 {
		return pod, nil
	}
	switch m {
	case nodeTotals:
		stockGPUs(pod, p)
	case claimsKubegpu, claimsStock:
		return pod, claimOf(pod, p, m)
	default:
		tracepods.AskGPUs(pod, p)
	}
	return pod, nil
}

// stockGPUs gives pod num_gpu × gpu_milli of the node's stockGPUMilli, and
// the models of gpu_spec as a node label it selects.
func stockGPUs(pod *corev1.Pod, p *sim.PodSpec) {
	q := *resource.NewQuantity(p.TotalGPUMilli(), resource.DecimalSI)
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{stockGPUMilli: q}
	pod.Spec.Containers[0].Resources.Requests[stockGPUMilli] = q
	if len(p.GPUSpec) > 0 {
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: stockModel, Operator: corev1.NodeSelectorOpIn, Values: p.GPUSpec}},
			}}},
		}}
	}
}

// claimOf is the ResourceClaim, named as the pod, that asks for p's GPUs,
// and makes pod use it: num_gpu devices, each a whole GPU or, below
// gpu_milli 1000, the capacity request cores; gpu_spec's models as a CEL
// selector on the model attribute.
func claimOf(pod *corev1.Pod, p *sim.PodSpec, m mode) *resourceapi.ResourceClaim {
	r := &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(p.NumGPU)}
	if m == claimsStock {
		r.DeviceClassName = stockClass
		r.Tolerations = []resourceapi.DeviceToleration{{Key: dra.TaintManaged, Operator: resourceapi.DeviceTolerationOpExists}}
	}
	if p.GPUMilli < 1000 {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			dra.CapacityCores: *resource.NewQuantity(tracepods.Cores(p), resource.DecimalSI)}}
	}
	if len(p.GPUSpec) > 0 {
		q := make([]string, len(p.GPUSpec))
		for i, model := range p.GPUSpec {
			q[i] = strconv.Quote(model)
		}
		r.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.attributes[%q].%s in [%s]", dra.DriverName, dra.AttributeModel, strings.Join(q, ", "))}}}
	}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(pod.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: r}}}}}
}

// clearClaims deletes the replay's ResourceClaims, once their pods are
// gone: without kube-controller-manager nothing releases them, so their
// finalizers are taken off first.
func (cs *clusterScheduler) clearClaims(ctx context.Context) error {
	claims := cs.client.ResourceV1().ResourceClaims(namespace)
	return deleteAll(ctx, "claims", func(ctx context.Context) ([]string, error) {
		list, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		return objectNames(list)
	}, func(ctx context.Context, name string) error {
		if _, err := claims.Patch(ctx, name, ktypes.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			return err
		}
		return claims.Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// clear deletes the replay's pods and waits until they are gone.
func (cs *clusterScheduler) clear(ctx context.Context) error {
	pods := cs.client.CoreV1().Pods(namespace)
	return deleteAll(ctx, "pods", func(ctx context.Context) ([]string, error) {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		return objectNames(list)
	}, func(ctx context.Context, name string) error {
		return pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
}

// deleteAll deletes the objects list names, 16 at a time, until none is
// left, for up to 5 minutes: one DeleteCollection of thousands of pods
// outlasts the API server's request timeout on a busy machine.
func deleteAll(ctx context.Context, what string, list func(context.Context) ([]string, error), del func(context.Context, string) error) error {
	var last error
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		names, err := list(ctx)
		if err != nil {
			last = err
			continue
		}
		if len(names) == 0 {
			return nil
		}
		var g errgroup.Group
		g.SetLimit(16)
		for _, name := range names {
			g.Go(func() error {
				if err := del(ctx, name); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			last = err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if last == nil {
		return fmt.Errorf("the replay's %s were not deleted within 5 minutes", what)
	}
	return fmt.Errorf("the replay's %s were not deleted within 5 minutes: %w", what, last)
}

// objectNames are the names of a list's items.
func objectNames(list runtime.Object) ([]string, error) {
	var names []string
	err := meta.EachListItem(list, func(o runtime.Object) error {
		m, err := meta.Accessor(o)
		if err == nil {
			names = append(names, m.GetName())
		}
		return err
	})
	return names, err
}
