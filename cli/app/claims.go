package app

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/types"
)

// podClaims are a pod's ResourceClaims of kubegpu's DeviceClass as
// kubegpu-scheduler compiles them (package claims): the engine's requests
// for those to allocate, and the node those allocated are on.
type podClaims struct {
	claims []claims.PodClaim
	// variants are the requests of the claims to allocate, one list per
	// combination of their alternatives (claims.Compile).
	variants [][]types.ContainerRequest
	node     string
	// slicesUnread is set when the caller may not list ResourceSlices:
	// selectors and alternatives were judged as if no device matched.
	slicesUnread bool
}

// loadPodClaims reads and compiles pod's kubegpu claims; nil when it has
// none. An error of package claims is what keeps the pod waiting.
func loadPodClaims(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod) (*podClaims, error) {
	if len(pod.Spec.ResourceClaims) == 0 {
		return nil, nil
	}
	pcs, err := claims.ForPod(pod, claimGetter{ctx, c}, nil)
	if err != nil || len(pcs) == 0 {
		return nil, err
	}
	out := &podClaims{claims: pcs}
	for _, pc := range pcs {
		if pc.Allocated() {
			if out.node, err = claims.NodeOf(pc.Claim); err != nil {
				return nil, err
			}
		}
	}
	comp := &claims.Compiler{Classes: &classList{ctx: ctx, c: c}, CEL: cel.NewCache(16, cel.Features{EnableConsumableCapacity: true}),
		Devices: func() ([]*resourceapi.ResourceSlice, error) {
			list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if apierrors.IsForbidden(err) {
				// A viewer role from before kubegpu read slices: judged
				// as if no device were published (selectors match none),
				// and said so.
				out.slicesUnread = true
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			out := make([]*resourceapi.ResourceSlice, len(list.Items))
			for i := range list.Items {
				out[i] = &list.Items[i]
			}
			return out, nil
		}}
	if out.variants, err = comp.Compile(ctx, pcs); err != nil {
		if out.slicesUnread {
			return nil, fmt.Errorf("%w (judged as if no device were published: your role may not list ResourceSlices)", err)
		}
		return nil, err
	}
	return out, nil
}

// compile compiles the pod's request as kubegpu-scheduler's PreFilter
// does (devicecache.CompileVariants). pc may be nil.
func (pc *podClaims) compile(engine *devicescheduler.Engine, pod *corev1.Pod, host devicescheduler.Host, policy types.EnforcementPolicy) (*devicescheduler.Request, types.PodRequest, []*devicescheduler.Request, error) {
	var variants [][]types.ContainerRequest
	if pc != nil {
		variants = pc.variants
	}
	return devicecache.CompileVariants(engine, pod, host, policy, variants)
}

// decideVariants is decide for the first of the inputs (the variants of a
// pod's claims, in DRA's order of preference) that fits node, ranked as
// kubegpu-scheduler ranks it (claims.RankScore); when none fits, the
// verdict kubegpu-scheduler's Filter answers with (the most hopeful,
// devicecache.MostHopeful).
func decideVariants(c *devicecache.Cache, ins []devicecache.Input, node *corev1.Node, requested [2]int64, self *corev1.Pod, nominated []nominee) explainRow {
	rows := make([]explainRow, 0, len(ins))
	refusals := make([]error, 0, len(ins))
	for i := range ins {
		row := decide(c, &ins[i], node, requested, self, nominated)
		if row.fits {
			row.score = claims.RankScore(row.score, i, len(ins))
			return row
		}
		if row.refusal == nil {
			return row // DRA serves the pod there, whatever the variant
		}
		rows, refusals = append(rows, row), append(refusals, row.refusal)
	}
	return rows[devicecache.MostHopeful(refusals)]
}

// claimGetter gets claims from the API server.
type claimGetter struct {
	ctx context.Context
	c   kubernetes.Interface
}

func (g claimGetter) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	return g.c.ResourceV1().ResourceClaims(namespace).Get(g.ctx, name, metav1.GetOptions{})
}

// classList gets DeviceClasses from one list (the viewer role lists them).
type classList struct {
	ctx     context.Context
	c       kubernetes.Interface
	classes map[string]*resourceapi.DeviceClass
}

func (l *classList) Get(name string) (*resourceapi.DeviceClass, error) {
	if l.classes == nil {
		list, err := l.c.ResourceV1().DeviceClasses().List(l.ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		l.classes = map[string]*resourceapi.DeviceClass{}
		for i := range list.Items {
			l.classes[list.Items[i].Name] = &list.Items[i]
		}
	}
	if dc, ok := l.classes[name]; ok {
		return dc, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// claimsNote says what the pod's kubegpu claims are and where they pin it.
func (pc *podClaims) note() string {
	if pc == nil {
		return ""
	}
	s := fmt.Sprintf("It has %d ResourceClaim(s) of kubegpu's DeviceClass: kubegpu-scheduler allocates them with its engine (the requests named claim/... below), and writes each allocation into its claim's status.", len(pc.claims))
	if pc.node != "" {
		s += fmt.Sprintf(" Claims of it are allocated on %s: no other node can take it.", pc.node)
	}
	if pc.slicesUnread {
		s += " Your role may not list ResourceSlices: the claims' selectors and alternatives are judged as if no device matched them, which kubegpu-scheduler does not do."
	}
	if n := len(pc.variants); n > 1 {
		s += fmt.Sprintf(" Its claims have alternatives (firstAvailable), %d ways in all: the requests above are the first; each node below is judged with the first way that fits there, and nodes that take an earlier way rank first.", n)
	}
	return s
}

// claimError is what explain prints for a pod whose claims keep it
// waiting, or an error to return.
func claimError(err error) (string, error) {
	if errors.Is(err, claims.ErrWaiting) || errors.Is(err, claims.ErrInvalid) {
		return sanitize(err.Error()), nil
	}
	return "", err
}

// claimHold is a kubegpu claim's allocation: its devices and the pods it
// is reserved for.
type claimHold struct {
	claim *resourceapi.ResourceClaim
	alloc types.PodAllocation
}

// holders names the claim and the pods it is reserved for, for `gpus`.
func (h claimHold) holders() []string {
	var out []string
	for _, r := range h.claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, fmt.Sprintf("%s/%s (claim %s)", h.claim.Namespace, r.Name, h.claim.Name))
		}
	}
	if len(out) == 0 {
		out = append(out, fmt.Sprintf("%s/%s (claim, no pod)", h.claim.Namespace, h.claim.Name))
	}
	return out
}
