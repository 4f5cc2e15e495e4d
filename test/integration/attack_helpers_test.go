package integration

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// policies are kubegpu's admission policies, as shipped.
var policies = filepath.Join(repoRoot, "deploy/admission/kubegpu-policies.yaml")

// policyProbe is refused by kubegpu-allocation while the policies are in
// force: a pod created with an allocation.
func policyProbe() *corev1.Pod {
	p := gpuPod("policy-probe", 1, 0, 0, map[string]string{kubeinterface.AnnotationAllocation: "probe"})
	p.Namespace = metav1.NamespaceDefault
	return p
}

// policyRefuses reports whether the API server refuses a dry run of
// probe, created by c in ns, with policy now.
func policyRefuses(ctx context.Context, c kubernetes.Interface, ns string, probe *corev1.Pod, policy string) bool {
	_, err := c.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err != nil && strings.Contains(err.Error(), policy)
}

// policyProbes are pods each refused by one of kubegpu's policies while it
// is in force, keyed by the policy. They are created by a tenant: the
// policies let operators (cluster-admin included) do some of these.
func policyProbes() map[string]*corev1.Pod {
	pinned := gpuPod("policy-probe", 1, 0, 0, nil)
	pinned.Spec.NodeName = "no-such-node"
	share := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{kubeinterface.ResourceGPUShare: resource.MustParse("1")}}}}}}
	return map[string]*corev1.Pod{
		"kubegpu-allocation":  policyProbe(),
		"kubegpu-gpu-request": gpuPod("policy-probe", 400, 0, 0, nil), // more GPUs than a container may ask for
		"kubegpu-node-name":   pinned,
		"kubegpu-gpu-share":   share,
	}
}

// policiesInForce reports whether the API server applies kubegpu's
// allocation policy now (as cluster-admin sees it).
func policiesInForce(ctx context.Context) bool {
	p := policyProbe()
	return policyRefuses(ctx, cluster.Client, p.Namespace, p, "kubegpu-allocation")
}

// probePolicies reports whether every probed policy refuses its probe
// (want true) or none does (want false), for the tenant c of ns. The API
// server takes in each policy on its own: one may be in force while
// another is not yet, or no longer.
func probePolicies(ctx context.Context, c kubernetes.Interface, ns string, want bool) bool {
	for policy, probe := range policyProbes() {
		probe.Namespace = ""
		if policyRefuses(ctx, c, ns, probe, policy) != want {
			return false
		}
	}
	return sharesPods(ctx, c, ns) == want
}

// sharesPods reports whether the mutating policy kubegpu-gpu-share is in
// force for the tenant c of ns: a dry run of a one-GPU pod is admitted
// with the share it sets. The validating policy that checks that share can
// be in force a moment before the mutating one, refusing every GPU pod.
func sharesPods(ctx context.Context, c kubernetes.Interface, ns string) bool {
	p, err := c.CoreV1().Pods(ns).Create(ctx, gpuPod("policy-probe", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false
	}
	share := p.Spec.Containers[0].Resources.Requests[kubeinterface.ResourceGPUShare]
	return share.Value() == 100
}

// withoutPolicies removes kubegpu's admission policies for the rest of the
// test, as on a cluster whose operator did not install them, and puts them
// back when the test ends: what the scheduler and the shim guarantee must
// hold without them.
func withoutPolicies(ctx context.Context, t *testing.T) {
	t.Helper()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(strings.TrimPrefix(t.Name(), "Test")))
	ns := namespace(ctx, t, "probe-"+name[:min(len(name), 50)])
	c := tenant(t, ns)
	if err := cluster.Delete(ctx, policies); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := cluster.Apply(ctx, policies); err != nil {
			t.Error(err)
			return
		}
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return probePolicies(ctx, c, ns, true), nil
		}); err != nil {
			t.Errorf("kubegpu's admission policies not back in force: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return probePolicies(ctx, c, ns, false), nil
	}); err != nil {
		t.Fatalf("kubegpu's admission policies still in force after their removal: %v", err)
	}
}

// refused checks that err is a refusal whose message contains every part.
func refused(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused with %q", what, parts)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: refused with %q, want a message with %q", what, err, p)
			return
		}
	}
}

// ledger remembers, for the whole test, the devices every bound GPU pod
// was first seen holding: a tenant who later changes what its pod says
// does not change what its containers hold.
type ledger struct {
	mu    sync.Mutex
	first map[ktypes.UID]kubeinterface.Allocation
}

func newLedger() *ledger { return &ledger{first: map[ktypes.UID]kubeinterface.Allocation{}} }

// check reads every pod in the cluster and fails the test if any device
// is held twice: exclusively by two pods, or shared beyond its compute or
// memory. A pod holds what it holds now (its verified allocation: the
// scheduler's record, else its annotation) and what it was first seen
// holding, if it still runs.
func (l *ledger) check(ctx context.Context, t *testing.T, after string) {
	t.Helper()
	pods, err := viewer.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := viewer.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	memory := map[string]int64{} // node/device ID -> MiB
	for i := range nodes.Items {
		if inv, err := objects.NodeInventory(&nodes.Items[i]); err == nil {
			for _, d := range inv.Devices {
				memory[nodes.Items[i].Name+"/"+d.ID] = d.MemoryMiB
			}
		}
	}
	type use struct {
		exclusive []string
		shared    []string
		cores     int
		memMiB    int64
	}
	uses := map[string]*use{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		holds := map[string]kubeinterface.Allocation{}
		if h, err := objects.HeldAllocation(p, signingKey.Verify); err == nil {
			holds["now"] = h.Allocation
			if _, seen := l.first[p.UID]; !seen {
				l.first[p.UID] = h.Allocation
			}
		}
		if a, ok := l.first[p.UID]; ok {
			holds["first"] = a
		}
		seen := map[string]bool{}
		for _, a := range holds {
			for _, c := range append(append([]types.ContainerAllocation{}, a.InitContainers...), a.Containers...) {
				for _, d := range c.Devices {
					key := a.Node + "/" + d.ID
					if seen[key+"/"+c.Name] {
						continue // the same share, seen now and first
					}
					seen[key+"/"+c.Name] = true
					u := uses[key]
					if u == nil {
						u = &use{}
						uses[key] = u
					}
					who := p.Namespace + "/" + p.Name
					if d.Exclusive {
						u.exclusive = append(u.exclusive, who)
					} else {
						u.shared = append(u.shared, who)
						u.cores += d.ComputePercent
						u.memMiB += d.MemoryMiB
					}
				}
			}
		}
	}
	for key, u := range uses {
		if len(u.exclusive) > 1 || (len(u.exclusive) == 1 && len(u.shared) > 0) || u.cores > 100 || (memory[key] > 0 && u.memMiB > memory[key]) {
			t.Errorf("after %s: device %s given twice: exclusively to %v, shared by %v (%d%%, %d of %d MiB)",
				after, key, u.exclusive, u.shared, u.cores, u.memMiB, memory[key])
		}
	}
}

// operator returns an identity bound to the shipped ClusterRole
// kubegpu-node-name-setter, and to edit in ns: it may create GPU pods with
// spec.nodeName there.
func operator(ctx context.Context, t *testing.T, ns string) *localcluster.Identity {
	t.Helper()
	return operatorWith(ctx, t, ns, "kubegpu-node-name-setter")
}

// operatorWith returns an identity bound to the shipped ClusterRole role,
// and to edit in ns.
func operatorWith(ctx context.Context, t *testing.T, ns, role string) *localcluster.Identity {
	t.Helper()
	user := "gpu-operator-" + role
	_, err := cluster.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	id, err := cluster.Identity(user)
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(ctx, t, id, ns)
	return id
}

// waitPod waits, for a minute at most, until pod ns/name is as ok says
// (what names that in the failure) and returns it.
func waitPod(ctx context.Context, t *testing.T, ns, name, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		p, err = viewer.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && ok(p), nil
	}); err != nil {
		t.Fatalf("pod %s/%s not %s: %v", ns, name, what, err)
	}
	return p
}

// boundPod waits until pod ns/name is bound and returns it.
func boundPod(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	return waitPod(ctx, t, ns, name, "bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
}

// recordedPod waits until pod ns/name carries the scheduler's record of its
// allocation and returns it.
func recordedPod(ctx context.Context, t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	return waitPod(ctx, t, ns, name, "recorded (the scheduler's record of its allocation)", func(p *corev1.Pod) bool {
		_, ok := objects.RecordValue(p)
		return ok
	})
}

// devicesOf lists the device IDs of a pod's verified allocation.
func devicesOf(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	h, err := objects.HeldAllocation(p, signingKey.Verify)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	var ids []string
	for _, c := range h.Containers {
		for _, d := range c.Devices {
			ids = append(ids, d.ID)
		}
	}
	return ids
}
