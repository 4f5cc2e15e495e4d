package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// TestClaimPodOnRealNode: on a real node (kubelet, kubegpu-crishim,
// containerd), kubelet has kubegpu-crishim prepare a pod's kubegpu claim
// (its signed allocation verified) and the container sees exactly the
// claimed GPUs, beside an annotation pod with the other two; the ledger
// holds no GPU twice. The claim's request has alternatives (five GPUs,
// else two), and the container names the request: kubelet gives it the
// devices of the alternative allocated. A claim allocated without kubegpu-scheduler's
// signature is not prepared.
func TestClaimPodOnRealNode(t *testing.T) {
	ctx := context.Background()
	const nodeName = "claim-node"
	n := startNode(ctx, t)
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--kubeconfig="+nodeID.Kubeconfig, "--interval=1s",
		"--pod-resources-endpoint=unix://"+filepath.Join(n.Dir, "kubelet", "pod-resources", "kubelet.sock"))
	k := startKubelet(ctx, t, n, nodeName, sock, 10*time.Second)
	startScheduler(ctx, t)
	ns := namespace(ctx, t, "claimnode")
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := nodeSlices(ctx, nodeName)
		return err == nil && len(list) > 0, nil
	}); err != nil {
		t.Fatalf("no ResourceSlices of %s: %v", nodeName, err)
	}
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pair"}, Spec: altClaimSpec(5, 2)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := sleeper(claimUser("claimed", "pair", false))
	p.Spec.Containers[0].Command = []string{"sh", "-c", "env; sleep 3600"}
	p.Spec.Containers[0].Resources.Claims[0].Request = "gpus"
	createPods(ctx, t, ns, onNode(p, nodeName), onNode(sleeper(gpuPod("annotated", 2, 0, 0, nil)), nodeName))
	running := waitRunning(ctx, t, ns, "claimed", k)
	waitRunning(ctx, t, ns, "annotated", k)
	claim := claimOf(ctx, t, ns, running)
	if got := allocatedRequests(claim); got != "gpus/c2,gpus/c2" {
		t.Errorf("the claim's results are for %s, want two for gpus/c2", got)
	}
	var want []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		want = append(want, r.Device) // the simgpu IDs are DNS labels: the DRA names
	}
	slices.Sort(want)
	env := containerEnv(ctx, t, n, sock, "claimed")
	var got []string
	for _, line := range strings.Split(env, "\n") {
		if v, ok := strings.CutPrefix(line, "KUBEGPU_SIMGPU_DEVICES="); ok {
			got = strings.Split(v, ",")
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the claim's container sees GPUs %v, want exactly its claim's %v:\n%s", got, want, env)
	}
	if strings.Contains(env, "KUBEGPU_CLAIM_DEVICE") {
		t.Errorf("the claim's CDI devices reached the runtime:\n%s", env)
	}
	checkNoGPUTwice(ctx, t, n, sock, ns)

	// A claim for kubegpu's class allocated behind kubegpu-scheduler's
	// back (another scheduler, a forged status; here written as
	// cluster-admin) to a pod bound straight to the node: the node
	// refuses to prepare it.
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "forged"}, Spec: gpuClaimSpec(1)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	thief := sleeper(claimUser("thief", "forged", false))
	thief.Spec.NodeName = nodeName
	createPods(ctx, t, ns, thief)
	thiefPod, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "thief", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forged, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "forged", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	free := "gpu2"
	for _, d := range []string{"gpu0", "gpu1", "gpu2", "gpu3"} {
		if !slices.Contains(want, d) {
			free = d
		}
	}
	forged.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpus", Driver: dra.DriverName, Pool: nodeName, Device: free}}}}
	forged.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "thief", UID: thiefPod.UID}}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var events []string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=thief"})
		if err != nil {
			return false, nil
		}
		events = events[:0]
		for _, e := range list.Items {
			events = append(events, e.Reason+": "+e.Message)
			if strings.Contains(e.Message, "carries no SignedAllocation") {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the node did not refuse the forged claim: %v; events %q", err, events)
	}
	t.Logf("the forged claim's pod: %q", events)
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "thief", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodRunning {
		t.Errorf("the pod of the forged claim runs: %v", err)
	}
}

// TestClaimHolderPreempted: a lower-priority pod that holds all of a
// node's GPUs through its claim is preempted for a higher-priority pod's
// claim, which gets GPUs once the victim's claim is released. The
// higher-priority claim's first alternative (eight GPUs) never fits the
// 4-GPU node: its second (two) must still let preemption consider it.
func TestClaimHolderPreempted(t *testing.T) {
	ctx := context.Background()
	_, nodes, ns := claimNodes(ctx, t, "claimpre", "t4x4", 1)
	priorityClass(ctx, t, "kubegpu-test-claimpre-low", 10)
	priorityClass(ctx, t, "kubegpu-test-claimpre-high", 1000)
	finishing := &atomic.Bool{}
	finishing.Store(true)
	finishTerminating(ctx, t, ns, finishing)
	client := tenant(t, ns)
	for name, spec := range map[string]resourceapi.ResourceClaimSpec{"low": gpuClaimSpec(4), "high": altClaimSpec(8, 2)} {
		if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	low := claimUser("low", "low", false)
	low.Spec.PriorityClassName = "kubegpu-test-claimpre-low"
	createPods(ctx, t, ns, low)
	if pods := settle(ctx, t, ns, time.Second, time.Minute); len(pods) != 1 || pods[0].Spec.NodeName == "" {
		t.Fatalf("the low-priority pod was not bound: %v", failedSchedulingAll(ctx, t, ns))
	}
	high := claimUser("high", "high", false)
	high.Spec.PriorityClassName = "kubegpu-test-claimpre-high"
	createPods(ctx, t, ns, high)
	var p *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		p, err = cluster.Client.CoreV1().Pods(ns).Get(ctx, "high", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", nil
	}); err != nil {
		t.Fatalf("the high-priority claim pod was not bound: %v\n%s", err, strings.Join(failedSchedulingAll(ctx, t, ns), "\n"))
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "low", metav1.GetOptions{}); err == nil {
		t.Errorf("the low-priority pod is still there")
	}
	if got := claimedIndexes(t, claimOf(ctx, t, ns, p), nodes, p.Spec.NodeName); len(got) != 2 {
		t.Errorf("the high-priority claim got GPUs %v, want two", got)
	}
}

// TestClaimOverQuota: a namespace's ResourceQuota on kubegpu's DeviceClass
// (Kubernetes' own quota on DRA devices) refuses a claim that would pass
// it, with the API server's standard message, and admits one within it.
func TestClaimOverQuota(t *testing.T) {
	ctx := context.Background()
	ns := namespace(ctx, t, "claimquota")
	quota := corev1.ResourceName(dra.ClassName + ".deviceclass.resource.k8s.io/devices")
	if _, err := cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{quota: resource.MustParse("4")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The quota controller computes the usage first.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		q, err := cluster.Client.CoreV1().ResourceQuotas(ns).Get(ctx, "gpus", metav1.GetOptions{})
		return err == nil && q.Status.Used != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The API server's quota admission works from its own cache of the
	// quota: a moment after the controller writes the quota's status it may
	// not hold it yet, and a claim admitted then is not charged. Asked in
	// dry runs until it holds it (a claim over the whole quota refused),
	// then for real.
	client := tenant(t, ns)
	refusedNow := func(spec resourceapi.ResourceClaimSpec) {
		t.Helper()
		probe := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: spec}
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"), nil
		}); err != nil {
			t.Fatalf("the API server's quota admission never refused a dry run over the quota: %v", err)
		}
	}
	refusedNow(gpuClaimSpec(5))
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "three"}, Spec: gpuClaimSpec(3)}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a claim within the quota: %v", err)
	}
	refusedNow(gpuClaimSpec(2))
	over := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "two"}, Spec: gpuClaimSpec(2)}
	_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, over, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota: gpus") {
		t.Errorf("a claim over the quota: %v, want Forbidden: exceeded quota: gpus", err)
	}
}

// TestClaimQuotaInGPUEquivalents (policy kubegpu-claim-quota): a
// namespace capped in GPU equivalents gets no claim of kubegpu's class,
// which that cap does not count, until the same quota also caps the
// claims' devices; a scoped quota on GPU equivalents, which cannot count
// claims, refuses them until the operator labels the namespace, which its
// tenant cannot do; claims of other classes are not concerned.
func TestClaimQuotaInGPUEquivalents(t *testing.T) {
	ctx := context.Background()
	ns := namespace(ctx, t, "claimshare-quota")
	quotas := cluster.Client.CoreV1().ResourceQuotas(ns)
	share := corev1.ResourceName("requests." + kubeinterface.ResourceGPUShare)
	if _, err := quotas.Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{share: resource.MustParse("400")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := tenant(t, ns)
	create := func(name string, spec resourceapi.ResourceClaimSpec, dryRun bool) error {
		opts := metav1.CreateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, opts)
		return err
	}
	// The API server reads quotas from a cache of its own: asked in dry
	// runs until it answers as wanted.
	until := func(what string, spec resourceapi.ResourceClaimSpec, refusedWith string) {
		t.Helper()
		var last error
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			last = create("probe", spec, true)
			if refusedWith == "" {
				return last == nil, nil
			}
			return last != nil && strings.Contains(last.Error(), refusedWith), nil
		}); err != nil {
			t.Fatalf("%s: %v (want refused with %q)", what, last, refusedWith)
		}
	}
	until("a claim where GPU equivalents alone are capped", gpuClaimSpec(2), "also caps "+dra.DevicesQuota)
	until("alternatives where GPU equivalents alone are capped", altClaimSpec(2, 1), "kubegpu-claim-quota")
	other := gpuClaimSpec(1)
	other.Devices.Requests[0].Exactly.DeviceClassName = "other.example.com"
	if err := create("other", other, false); err != nil {
		t.Errorf("a claim of another class: %v", err)
	}
	patch := fmt.Sprintf(`{"spec":{"hard":{%q:"4"}}}`, dra.DevicesQuota)
	if _, err := quotas.Patch(ctx, "gpus", ktypes.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	until("a claim where the same quota caps devices too", gpuClaimSpec(2), "")

	// A quota on GPU equivalents for one PriorityClass only.
	if _, err := quotas.Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{share: resource.MustParse("0")},
		ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
			ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"kubegpu-test-claimquota-high"}}}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("a claim beside a scoped quota on GPU equivalents", gpuClaimSpec(2), "scoped quotas count no claims")
	label := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, kubeinterface.LabelNamespaceClaims, kubeinterface.NamespaceClaimsUncounted)
	if _, err := client.CoreV1().Namespaces().Patch(ctx, ns, ktypes.MergePatchType, []byte(label), metav1.PatchOptions{}); err == nil {
		t.Errorf("the tenant labelled its own namespace")
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Patch(ctx, ns, ktypes.MergePatchType, []byte(label), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	until("a claim in a namespace the operator labelled", gpuClaimSpec(2), "")
	if err := create("pair", gpuClaimSpec(2), false); err != nil {
		t.Errorf("a claim in a namespace the operator labelled: %v", err)
	}
}

// TestSharedClaim: two pods created at once that share one unallocated
// claim: one allocates it, the other waits for that allocation and joins
// it on the same node; the claim's GPUs are counted once, and stay held
// while either pod runs.
func TestSharedClaim(t *testing.T) {
	ctx := context.Background()
	_, nodes, ns := claimNodes(ctx, t, "claimshared", "t4x4", 2)
	if _, err := tenant(t, ns).ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Spec: gpuClaimSpec(3)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPods(ctx, t, ns, claimUser("a", "shared", false), claimUser("b", "shared", false))
	waitBound(ctx, t, ns, 2)
	a, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Spec.NodeName != b.Spec.NodeName {
		t.Fatalf("the pods of one claim are on %s and %s", a.Spec.NodeName, b.Spec.NodeName)
	}
	claim := claimOf(ctx, t, ns, a)
	claimOf(ctx, t, ns, b)
	if got := claimedIndexes(t, claim, nodes, a.Spec.NodeName); len(got) != 3 {
		t.Fatalf("the shared claim got GPUs %v, want three", got)
	}
	// Counted once: the claim's node has one GPU left, the other node four.
	var other string
	for _, n := range nodes.names {
		if n != a.Spec.NodeName {
			other = n
		}
	}
	one := gpuPod("one", 1, 0, 0, nil)
	one.Spec.NodeSelector = map[string]string{corev1.LabelHostname: a.Spec.NodeName}
	two := gpuPod("two", 2, 0, 0, nil)
	two.Spec.NodeSelector = map[string]string{corev1.LabelHostname: a.Spec.NodeName}
	four := gpuPod("four", 4, 0, 0, nil)
	four.Spec.NodeSelector = map[string]string{corev1.LabelHostname: other}
	createPods(ctx, t, ns, one, four)
	waitBound(ctx, t, ns, 4)
	createPods(ctx, t, ns, two)
	waitUnschedulable(ctx, t, ns, "two", "not enough free GPUs")
	// One of the claim's pods goes: the claim still holds its GPUs.
	deletePod(ctx, t, ns, "a", true)
	// The claim controller takes pod a off the reservations; the claim
	// stays allocated for b.
	var c *resourceapi.ResourceClaim
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err = cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "shared", metav1.GetOptions{})
		return err == nil && !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == a.UID }), nil
	}); err != nil {
		t.Fatalf("pod a was not taken off the shared claim's reservations: %v", err)
	}
	if c.Status.Allocation == nil || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != b.UID {
		t.Fatalf("the shared claim was released while pod b uses it: allocation %v, reserved for %+v", c.Status.Allocation != nil, c.Status.ReservedFor)
	}
}
