package integration

// The attack suite: what a tenant (namespaced, bound to the built-in edit
// role) and a node (its kubelet credentials, system:node:NAME) can try
// against kubegpu, on a cluster configured as in production. One test per
// attack and per admission policy; each checks that the attempt is refused
// with the message a user would need, and that no device is ever given
// twice (ledger.check) after it, restarts included. Where a guarantee must
// hold without kubegpu's admission policies (the scheduler's and the
// node's own defences), the test removes them first (withoutPolicies).

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestAttackNodeIsConfinedToItself (point 1): a node's credentials change
// its own Node and nothing of any other node's, and cannot rewrite the
// allocation of the pods bound to it. With those credentials alone a node
// advertises and stays live (TestKubeletThroughShim runs a GPU pod there).
func TestAttackNodeIsConfinedToItself(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "confined", "t4x4", 2)
	ns := namespace(ctx, t, "confined")
	l := newLedger()
	pod := gpuPod("victim", 1, 0, 0, nil)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "confined-1"}
	createPods(ctx, t, ns, pod)
	victim := recordedPod(ctx, t, ns, "victim")
	l.check(ctx, t, "scheduling")

	// A compromised confined-0 ...
	self, err := cluster.NodeIdentity("confined-0")
	if err != nil {
		t.Fatal(err)
	}
	c := self.Client
	inv := nodes.invs["confined-0"]
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	annotation := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, kubeinterface.AnnotationInventory, value)
	// ... publishes its own devices: allowed.
	if _, err := c.CoreV1().Nodes().Patch(ctx, "confined-0", ktypes.MergePatchType, annotation, metav1.PatchOptions{}); err != nil {
		t.Errorf("a node publishing its own inventory: %v", err)
	}
	// ... rewrites another node's inventory, capacity or Lease: refused.
	_, err = c.CoreV1().Nodes().Patch(ctx, "confined-1", ktypes.MergePatchType, annotation, metav1.PatchOptions{})
	refused(t, "node confined-0 patching confined-1's inventory", err, "forbidden")
	_, err = c.CoreV1().Nodes().Patch(ctx, "confined-1", ktypes.MergePatchType, []byte(`{"status":{"capacity":{"nvidia.com/gpu":"0"}}}`), metav1.PatchOptions{}, "status")
	refused(t, "node confined-0 patching confined-1's capacity", err, "forbidden")
	_, err = c.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Patch(ctx, "confined-1", ktypes.MergePatchType, []byte(`{"spec":{"renewTime":null}}`), metav1.PatchOptions{})
	refused(t, "node confined-0 patching confined-1's Lease", err, "forbidden")
	// A Lease of another name is refused too: why the liveness kubegpu
	// relies on is the kubelet's own Lease.
	_, err = c.CoordinationV1().Leases(kubeinterface.LeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kubegpu-confined-0", Namespace: kubeinterface.LeaseNamespace}}, metav1.CreateOptions{})
	refused(t, "node confined-0 creating a Lease of another name", err, "forbidden")
	// ... rewrites the status of a pod on another node: refused.
	_, err = c.CoreV1().Pods(ns).Patch(ctx, "victim", ktypes.MergePatchType, []byte(`{"status":{"conditions":[]}}`), metav1.PatchOptions{}, "status")
	refused(t, "node confined-0 patching the status of a pod on confined-1", err, "forbidden")

	// confined-1 itself may write its pods' status, but not their
	// allocation nor the scheduler's record of it.
	owner, err := cluster.NodeIdentity("confined-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = owner.Client.CoreV1().Pods(ns).Patch(ctx, "victim", ktypes.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, kubeinterface.AnnotationAllocation), metav1.PatchOptions{}, "status")
	refused(t, "node confined-1 removing its pod's allocation through pods/status", err, "kubegpu-allocation", "nobody may set, change or remove it")
	// ... nor the pod's request: NodeRestriction lets a node change its
	// pods' annotations through pods/status.
	for key, value := range map[string]string{kubeinterface.AnnotationTopology: "banana", kubeinterface.AnnotationModelInclude: "T4\x1b[2J",
		kubeinterface.AnnotationPlacement: "spread"} {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = owner.Client.CoreV1().Pods(ns).Patch(ctx, "victim", ktypes.MergePatchType, patch, metav1.PatchOptions{}, "status")
		refused(t, "node confined-1 setting its pod's "+key+" through pods/status", err, "kubegpu-gpu-request", "not through pods/status")
	}
	stripped := victim.DeepCopy()
	stripped.Status.Conditions = slices.DeleteFunc(stripped.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == kubeinterface.ConditionAllocated
	})
	_, err = owner.Client.CoreV1().Pods(ns).UpdateStatus(ctx, stripped, metav1.UpdateOptions{})
	refused(t, "node confined-1 removing the scheduler's record from its pod's status", err, "kubegpu-allocation", "only kubegpu-scheduler writes it")
	l.check(ctx, t, "a node's attempts")
}

// TestAttackClockSkew (point 1): the scheduler judges a node's liveness by
// when it saw the node's Lease renewed, on its own clock. A node whose clock
// is an hour behind gets pods while it renews; one whose clock is an hour
// ahead gets none once it stops, although its last renewal is "in the
// future".
func TestAttackClockSkew(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t, "heartbeatStaleness: 5s")
	nodes := addNodes(ctx, t, "skew-behind", "t4x4", 1, nodeOptions{clock: skewedClock{skew: -time.Hour}})
	nodes.addWith(ctx, t, "skew-ahead", "t4x4", 1, nodeOptions{clock: skewedClock{skew: time.Hour}})
	ns := namespace(ctx, t, "skew")
	behind := gpuPod("behind", 1, 0, 0, nil)
	behind.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "skew-behind-0"}
	createPods(ctx, t, ns, behind)
	if p := boundPod(ctx, t, ns, "behind"); p.Spec.NodeName != "skew-behind-0" {
		t.Fatalf("pod behind bound to %s", p.Spec.NodeName)
	}
	nodes.pause("skew-ahead-0")
	time.Sleep(7 * time.Second)
	ahead := gpuPod("ahead", 1, 0, 0, nil)
	ahead.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "skew-ahead-0"}
	createPods(ctx, t, ns, ahead)
	var msgs []string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		msgs = failedScheduling(ctx, t, ns, "ahead")
		return slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "node's Lease was last seen renewed") }), nil
	}); err != nil {
		t.Errorf("pod ahead: no FailedScheduling for the node that stopped renewing (its Lease stamped an hour ahead); got %q", msgs)
	}
	if p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "ahead", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("pod ahead bound to %q (%v), want pending: the node is dead", p.Spec.NodeName, err)
	}
}

// skewedClock is the real clock off by skew.
type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

// TestAttackTenantStripsAllocation (point 2, policy kubegpu-allocation): a
// tenant cannot change or remove its running pod's allocation; and where
// the policies are not installed and it does, a restarted scheduler still
// counts the pod's GPUs (its record in the pod's status, which tenants
// cannot write) and gives none of them to the next pod.
func TestAttackTenantStripsAllocation(t *testing.T) {
	ctx := context.Background()
	s := startScheduler(ctx, t)
	addNodes(ctx, t, "strip", "dgx1", 1)
	ns := namespace(ctx, t, "strip")
	l := newLedger()
	tc := tenant(t, ns)
	createPods(ctx, t, ns, gpuPod("holder", 4, 0, 0, nil))
	holder := recordedPod(ctx, t, ns, "holder")
	held := devicesOf(t, holder)
	l.check(ctx, t, "scheduling the holder")

	remove := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, kubeinterface.AnnotationAllocation)
	junk := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"{junk"}}}`, kubeinterface.AnnotationAllocation)
	for what, patch := range map[string][]byte{"removing": remove, "replacing with junk": junk} {
		_, err := tc.CoreV1().Pods(ns).Patch(ctx, "holder", ktypes.MergePatchType, patch, metav1.PatchOptions{})
		refused(t, "tenant "+what+" its pod's allocation", err, "kubegpu-allocation", "delete the pod and create it again")
	}
	_, err := tc.CoreV1().Pods(ns).Patch(ctx, "holder", ktypes.MergePatchType, []byte(`{"status":{"conditions":[]}}`), metav1.PatchOptions{}, "status")
	refused(t, "tenant patching its pod's status", err, "forbidden")

	// Without the policies the tenant succeeds; the scheduler restarts.
	withoutPolicies(ctx, t)
	if _, err := tc.CoreV1().Pods(ns).Patch(ctx, "holder", ktypes.MergePatchType, remove, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	startScheduler(ctx, t)
	createPods(ctx, t, ns, gpuPod("next-0", 4, 0, 0, nil), gpuPod("next-1", 4, 0, 0, nil))
	pods := settle(ctx, t, ns, 2*time.Second, time.Minute)
	l.check(ctx, t, "the tenant stripped its allocation and the scheduler restarted")
	for _, p := range pods {
		if p.Name == "holder" || p.Spec.NodeName == "" {
			continue
		}
		for _, d := range devicesOf(t, &p) {
			if slices.Contains(held, d) {
				t.Errorf("pod %s got %s, which the holder's containers hold", p.Name, d)
			}
		}
	}
	if bound(pods) != 2 {
		t.Errorf("%d pods bound, want 2 (the holder and one of next-0, next-1 on the 8-GPU node)", bound(pods))
	}
	// The tenant put the annotation back: nothing changes.
	if _, err := tc.CoreV1().Pods(ns).Patch(ctx, "holder", ktypes.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, kubeinterface.AnnotationAllocation, holder.Annotations[kubeinterface.AnnotationAllocation]),
		metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	l.check(ctx, t, "the tenant put its allocation back")
}

// TestAttackNodeNamePod (point 3, policy kubegpu-node-name): a GPU pod
// created with spec.nodeName would skip the scheduler and hold kubelet's
// nvidia.com/gpu; it is refused unless an operator creates it. Without the
// policies, the scheduler counts such a pod's nvidia.com/gpu as kubelet
// does and sends GPU pods elsewhere instead of to a kubelet that would
// refuse them.
func TestAttackNodeNamePod(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "squat", "t4x4", 2)
	ns := namespace(ctx, t, "squat")
	l := newLedger()
	pinned := gpuPod("pinned", 1, 0, 0, nil)
	pinned.Spec.NodeName = "squat-0"
	_, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, pinned, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "tenant creating a GPU pod with spec.nodeName", err, "kubegpu-node-name",
		"remove spec.nodeName and pin the pod with a nodeSelector on kubernetes.io/hostname instead")
	if _, err := operator(ctx, t, ns).Client.CoreV1().Pods(ns).Create(ctx, pinned, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("an operator bound to kubegpu-node-name-setter creating a GPU pod with spec.nodeName: %v", err)
	}

	// Without the policies: a pod bound by hand holds 400 of squat-0's
	// 400 nvidia.com/gpu as kubelet counts them.
	squatter := gpuPod("squatter", 1, 0, 0, nil)
	squatter.Spec.NodeName = "squat-0"
	squatter.Spec.Containers[0].Resources.Limits[kubeinterface.ResourceGPU] = resource.MustParse("400")
	withoutPolicies(ctx, t)
	createPods(ctx, t, ns, squatter)
	var pods []*corev1.Pod
	for i := range 5 {
		pods = append(pods, gpuPod(fmt.Sprintf("gpu-%d", i), 1, 0, 0, nil))
	}
	createPods(ctx, t, ns, pods...)
	placed := 0
	for _, p := range settle(ctx, t, ns, 2*time.Second, time.Minute) {
		switch {
		case p.Name == "squatter":
		case p.Spec.NodeName == "squat-0":
			t.Errorf("pod %s bound to squat-0, whose kubelet has 0 of 400 nvidia.com/gpu left and would refuse it", p.Name)
		case p.Spec.NodeName != "":
			placed++
		}
	}
	if placed != 4 {
		t.Errorf("%d GPU pods bound, want 4 (squat-1's GPUs)", placed)
	}
	if msgs := failedSchedulingAll(ctx, t, ns); !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "Insufficient nvidia.com/gpu") }) {
		t.Errorf("no FailedScheduling event names squat-0's exhausted nvidia.com/gpu; got %q", msgs)
	}
	l.check(ctx, t, "a pod bound by hand")
}

// TestAttackSecondSchedulerMode (policy kubegpu-scheduler-name): where
// kubegpu-scheduler runs beside the stock scheduler, a GPU pod addressed to
// another scheduler is refused, naming kubegpu-scheduler.
func TestAttackSecondSchedulerMode(t *testing.T) {
	ctx := context.Background()
	second := filepath.Join(repoRoot, "deploy/admission/second-scheduler.yaml")
	if err := cluster.Apply(ctx, second); err != nil {
		t.Fatal(err)
	}
	ns := namespace(ctx, t, "second")
	tc := tenant(t, ns)
	gpu := gpuPod("gpu", 1, 0, 0, nil)
	t.Cleanup(func() {
		ctx := context.Background()
		if err := cluster.Delete(ctx, second); err != nil {
			t.Error(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPod("gpu", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil, nil
		}); err != nil {
			t.Errorf("kubegpu-scheduler-name still in force after its removal: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := tc.CoreV1().Pods(ns).Create(ctx, gpu, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil, nil
	}); err != nil {
		t.Fatal("a GPU pod for the default scheduler is still admitted")
	}
	_, err := tc.CoreV1().Pods(ns).Create(ctx, gpu, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a GPU pod naming no scheduler", err, "kubegpu-scheduler-name", `GPU pods must set spec.schedulerName: kubegpu-scheduler, got "default-scheduler"`)
	gpu.Spec.SchedulerName = "kubegpu-scheduler"
	if _, err := tc.CoreV1().Pods(ns).Create(ctx, gpu, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a GPU pod for kubegpu-scheduler: %v", err)
	}
	cpu := gpuPod("cpu", 0, 0, 0, nil)
	if _, err := tc.CoreV1().Pods(ns).Create(ctx, cpu, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a pod without GPUs for the default scheduler: %v", err)
	}
}

// TestAttackRecreatedFromYAML (point 5, policy kubegpu-allocation): a pod
// re-created from a GPU pod's YAML, its old allocation included, is refused
// at creation with what to do; the tenant cannot bind pods itself either.
// Without the policies, the scheduler replaces the stale or forged
// allocation with a fresh one and counts nothing for it.
func TestAttackRecreatedFromYAML(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "recreate", "dgx1", 1)
	ns := namespace(ctx, t, "recreate")
	l := newLedger()
	tc := tenant(t, ns)
	createPods(ctx, t, ns, gpuPod("original", 2, 0, 0, nil))
	original := recordedPod(ctx, t, ns, "original")
	yaml := original.DeepCopy()
	yaml.ObjectMeta = metav1.ObjectMeta{Name: "copy", Annotations: original.Annotations}
	yaml.Spec.NodeName = ""
	yaml.Status = corev1.PodStatus{}
	_, err := tc.CoreV1().Pods(ns).Create(ctx, yaml, metav1.CreateOptions{})
	refused(t, "a pod created with an allocation", err, "kubegpu-allocation", "kubegpu.io/allocation is written by kubegpu-scheduler; remove it from the manifest")
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "original", Annotations: original.Annotations},
		Target: corev1.ObjectReference{Kind: "Node", Name: "recreate-0"}}
	err = tc.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{})
	refused(t, "tenant binding a pod", err, "forbidden")

	withoutPolicies(ctx, t)
	createPods(ctx, t, ns, yaml)
	squatter := yaml.DeepCopy()
	squatter.Name = "squatter"
	squatter.Spec.NodeName = "recreate-0"
	createPods(ctx, t, ns, squatter)
	createPods(ctx, t, ns, gpuPod("honest", 4, 0, 0, nil))
	pods := settle(ctx, t, ns, 2*time.Second, time.Minute)
	var check []corev1.Pod
	for _, p := range pods {
		if p.Name != "squatter" {
			check = append(check, p)
		}
	}
	allocs := checkAllocations(t, check, nodes.invs)
	if a, ok := allocs["copy"]; !ok || a.Pod.UID == original.UID {
		t.Errorf("pod copy: allocation %+v, want a fresh one of its own", a.Pod)
	}
	if _, ok := allocs["honest"]; !ok {
		t.Error("pod honest (4 GPUs) not bound: the copied allocation of a pod bound by hand was counted")
	}
	l.check(ctx, t, "pods created with copied allocations")
}

// TestAttackCLIShowsOnlyWhatVerifies: `kubegpu gpus`, run with the shipped
// read-only role, counts only allocations that verify and lists the others;
// what a node publishes cannot write control sequences to the terminal.
func TestAttackCLIShowsOnlyWhatVerifies(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "cli-verify", "t4x4", 1)
	ns := namespace(ctx, t, "cli-verify")
	createPods(ctx, t, ns, gpuPod("real", 1, 0, 0, nil))
	real := recordedPod(ctx, t, ns, "real")

	// Without the policies, a tenant binds a pod with an allocation of
	// its own making (and another's, copied).
	withoutPolicies(ctx, t)
	forged := gpuPod("forged", 1, 0, 0, map[string]string{kubeinterface.AnnotationAllocation: real.Annotations[kubeinterface.AnnotationAllocation]})
	forged.Spec.NodeName = "cli-verify-0"
	createPods(ctx, t, ns, forged)
	// A node publishes a model with a terminal escape sequence.
	evil, err := cluster.NodeIdentity("cli-verify-0")
	if err != nil {
		t.Fatal(err)
	}
	raw := `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":[{"id":"gpu0","uuid":"GPU-0","model":"T4\u001b[2J\u001b]0;owned\u0007","health":"Healthy"}]}`
	if _, err := evil.Client.CoreV1().Nodes().Patch(ctx, "cli-verify-0", ktypes.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, kubeinterface.AnnotationInventory, raw), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	addNodes(ctx, t, "cli-verify-ok", "t4x4", 1)

	out := kubegpu(t, "gpus")
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("kubegpu gpus printed a control character:\n%q", out)
	}
	for _, want := range []string{"Not counted", ns + "/forged on cli-verify-0", "allocation belongs elsewhere"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubegpu gpus lacks %q:\n%s", want, out)
		}
	}
	var rows []struct {
		Node string   `json:"node"`
		Pods []string `json:"pods"`
	}
	cmd := exec.Command(filepath.Join(binDir, "kubegpu"), "--kubeconfig", viewer.Kubeconfig, "--allocation-key", pubFile, "gpus", "-o", "json")
	js, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if slices.Contains(r.Pods, ns+"/forged") {
			t.Errorf("kubegpu gpus -o json counts pod forged on %s", r.Node)
		}
	}
	explain := kubegpu(t, "explain", "-n", ns, "forged")
	if strings.ContainsAny(explain, "\x1b\x07") || !strings.Contains(explain, "without a usable allocation") {
		t.Errorf("kubegpu explain forged:\n%q", explain)
	}
}

// TestAttackForceDelete (policy kubegpu-graceful-delete): a tenant cannot
// force-delete (or evict with no grace period) a bound GPU pod, which would
// free its GPUs while its containers still run; deleted with a grace
// period, the pod holds its GPUs until its node confirms its containers are
// gone. Nodes (kubelet's final deletion) and operators bound to
// kubegpu-gpu-pod-force-deleter may force-delete.
func TestAttackForceDelete(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "force", "t4x4", 1)
	ns := namespace(ctx, t, "force")
	tc := tenant(t, ns)
	l := newLedger()
	createPods(ctx, t, ns, gpuPod("holder", 2, 0, 0, nil))
	boundPod(ctx, t, ns, "holder")
	err := tc.CoreV1().Pods(ns).Delete(ctx, "holder", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	refused(t, "tenant force-deleting a bound GPU pod", err, "kubegpu-graceful-delete", "delete it with a grace period")
	err = tc.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: ns},
		DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}})
	refused(t, "tenant evicting a GPU pod with no grace period", err, "kubegpu-graceful-delete", "evict with a grace period")

	// A delete that names no grace period takes the pod's: a GPU pod must
	// have one.
	instant := gpuPod("instant", 1, 0, 0, nil)
	instant.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	_, err = tc.CoreV1().Pods(ns).Create(ctx, instant, metav1.CreateOptions{})
	refused(t, "a GPU pod with terminationGracePeriodSeconds 0", err, "kubegpu-gpu-request", "spec.terminationGracePeriodSeconds must be at least 1")
	// Deleting every pod of the namespace, or evicting with no options,
	// is graceful: the holder is terminating, and holds its GPUs until its
	// node (which here has no kubelet) confirms its containers are gone.
	if err := tc.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if p, err := viewer.Client.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("after DeleteCollection the holder is %v (%v), want terminating", p, err)
	}
	if err := tc.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: ns}}); err != nil {
		t.Fatalf("evicting with no options: %v", err)
	}
	createPods(ctx, t, ns, gpuPod("waits", 4, 0, 0, nil))
	if p := judged(ctx, t, ns, "waits"); p.Spec.NodeName != "" {
		t.Errorf("pod waits bound to %q while the terminating holder still holds 2 of the node's 4 GPUs", p.Spec.NodeName)
	}
	l.check(ctx, t, "a graceful delete")
	// kubelet's final deletion, once the containers are gone: allowed.
	node, err := cluster.NodeIdentity("force-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Client.CoreV1().Pods(ns).Delete(ctx, "holder", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Errorf("the node's final deletion of its pod: %v", err)
	}
	if p := boundPod(ctx, t, ns, "waits"); p.Spec.NodeName != "force-0" {
		t.Errorf("pod waits bound to %s", p.Spec.NodeName)
	}
	l.check(ctx, t, "the node's final deletion")
	// An operator may force-delete.
	op := operatorWith(ctx, t, ns, "kubegpu-gpu-pod-force-deleter")
	if err := op.Client.CoreV1().Pods(ns).Delete(ctx, "waits", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Errorf("an operator bound to kubegpu-gpu-pod-force-deleter force-deleting a GPU pod: %v", err)
	}
	// A finished pod holds nothing: its tenant may delete it at once.
	createPods(ctx, t, ns, gpuPod("done", 1, 0, 0, nil))
	boundPod(ctx, t, ns, "done")
	// The node authorizer learns of the binding from its own watch: the
	// node may read the pod a moment after it is bound.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := node.Client.CoreV1().Pods(ns).Get(ctx, "done", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the node cannot read the pod bound to it: %v", err)
	}
	// The scheduler writes its record into the status meanwhile: retry.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		done, err := node.Client.CoreV1().Pods(ns).Get(ctx, "done", metav1.GetOptions{})
		if err != nil {
			return err
		}
		done.Status.Phase = corev1.PodSucceeded
		_, err = node.Client.CoreV1().Pods(ns).UpdateStatus(ctx, done, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := tc.CoreV1().Pods(ns).Delete(ctx, "done", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Errorf("tenant deleting its finished GPU pod: %v", err)
	}
}

// TestAttackBindingsAndMirrorPods (policies kubegpu-allocation and
// kubegpu-node-name): a binder other than kubegpu-scheduler cannot bind a
// pod with an allocation through the legacy bindings resource either; a
// node's mirror pod of a static GPU pod is admitted (it gets no GPUs, and
// the scheduler counts its nvidia.com/gpu), and no tenant can pass its pod
// off as one.
func TestAttackBindingsAndMirrorPods(t *testing.T) {
	ctx := context.Background()
	addNodes(ctx, t, "mirror", "t4x4", 1)
	ns := namespace(ctx, t, "binders")
	tc := tenant(t, ns)
	// A custom binder: the tenant may create bindings in its namespace.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "binder"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"bindings", "pods/binding"}, Verbs: []string{"create"}}}}
	if _, err := cluster.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "binder"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "binder"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "tenant-" + ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := gpuPod("unbound", 1, 0, 0, nil)
	p.Spec.SchedulerName = "nobody"
	createPods(ctx, t, ns, p)
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "unbound", Annotations: map[string]string{kubeinterface.AnnotationAllocation: "set-by-another-binder"}},
		Target: corev1.ObjectReference{Kind: "Node", Name: "mirror-0"}}
	var err error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err = tc.CoreV1().RESTClient().Post().Namespace(ns).Resource("bindings").Body(binding).Do(ctx).Error()
		return err == nil || !strings.Contains(err.Error(), "cannot create resource"), nil // RBAC's cache
	}); err != nil {
		t.Fatal(err)
	}
	refused(t, "binding with an allocation through the legacy bindings resource", err, "kubegpu-allocation", "only kubegpu-scheduler binds pods with a kubegpu.io/allocation")
	err = tc.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{})
	refused(t, "binding with an allocation through pods/binding", err, "kubegpu-allocation", "only kubegpu-scheduler binds pods with a kubegpu.io/allocation")
	// A binding's annotations are copied onto the pod: none rewrites its
	// request.
	binding.Annotations = map[string]string{kubeinterface.AnnotationTopology: "banana"}
	err = tc.CoreV1().Pods(ns).Bind(ctx, binding, metav1.CreateOptions{})
	refused(t, "binding that sets the pod's topology annotation", err, "kubegpu-allocation", "a binding carries no kubegpu.io/ annotation")

	// A node's mirror pod of a static GPU pod.
	node, err := cluster.NodeIdentity("mirror-0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Client.CoreV1().Nodes().Get(ctx, "mirror-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mirror := gpuPod("static-gpu-mirror-0", 1, 0, 0, map[string]string{"kubernetes.io/config.mirror": "hash", "kubernetes.io/config.source": "file"})
	mirror.Spec.NodeName = "mirror-0"
	mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, Controller: ptr.To(true)}}
	if _, err := node.Client.CoreV1().Pods(ns).Create(ctx, mirror, metav1.CreateOptions{}); err != nil {
		t.Errorf("the node creating the mirror pod of a static GPU pod: %v", err)
	}
	fake := mirror.DeepCopy()
	fake.Name, fake.OwnerReferences = "fake-mirror", nil
	_, err = tc.CoreV1().Pods(ns).Create(ctx, fake, metav1.CreateOptions{})
	refused(t, "tenant creating a GPU pod dressed as a mirror pod", err, "kubegpu-node-name")
}
