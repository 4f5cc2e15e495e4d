package integration

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

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// publishSlices publishes the simulated nodes' devices as ResourceSlices,
// with each node's credentials, as their shims would, and waits for them.
func publishSlices(ctx context.Context, t *testing.T, sn *simNodes) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	sn.mu.Lock()
	defer sn.mu.Unlock()
	for _, name := range sn.names {
		inv, ok := sn.invs[name]
		if !ok {
			continue
		}
		client, err := kubernetes.NewForConfig(sn.kubelets[name].Identity.Config)
		if err != nil {
			t.Fatal(err)
		}
		node, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := advertiser.NewSlices(client, name, dra.Options{}, nil)
		s.Update(ctx, inv, node.UID)
		go s.Run(ctx)
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := nodeSlices(ctx, name)
			return err == nil && len(list) > 0, nil
		}); err != nil {
			t.Fatalf("node %s: no ResourceSlices: %v", name, err)
		}
	}
}

// claimNodes starts the scheduler, count simulated nodes of preset with
// their ResourceSlices published, and a namespace, all named by prefix.
func claimNodes(ctx context.Context, t *testing.T, prefix, preset string, count int) (*localcluster.Scheduler, *simNodes, string) {
	t.Helper()
	sched := startScheduler(ctx, t)
	nodes := addNodes(ctx, t, prefix, preset, count)
	publishSlices(ctx, t, nodes)
	return sched, nodes, namespace(ctx, t, prefix)
}

// gpuClaimSpec asks for count whole GPUs of kubegpu's DeviceClass.
func gpuClaimSpec(count int64) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}}}}
}

// claimUser is a pod whose container uses the pod's claim "gpu" of claim
// name (or template, with template set).
func claimUser(name, claim string, template bool) *corev1.Pod {
	pc := corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To(claim)}
	if template {
		pc = corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To(claim)}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{pc},
		Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
}

// claimOf returns the pod's claim "gpu" once it is allocated, and checks
// kubegpu's signature in it.
func claimOf(ctx context.Context, t *testing.T, ns string, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	name := ""
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			name = *s.ResourceClaimName
		}
	}
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.Name == "gpu" && pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		}
	}
	if name == "" {
		t.Fatalf("pod %s has no claim gpu: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s of pod %s is not allocated", name, pod.Name)
	}
	if !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
		t.Errorf("claim %s is not reserved for pod %s: %+v", name, pod.Name, c.Status.ReservedFor)
	}
	a, _, err := dra.SignedValue(c.Status.Allocation)
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	if err := kubeinterface.NewKeySet(signingKey).Verify(a); err != nil || a.Pod.UID != c.UID || a.Node != pod.Spec.NodeName {
		t.Errorf("claim %s: signed allocation %+v does not verify for the claim on node %s: %v", name, a.Pod, pod.Spec.NodeName, err)
	}
	return c
}

// claimedIndexes are the inventory indexes of the devices of a claim's
// allocation on node.
func claimedIndexes(t *testing.T, c *resourceapi.ResourceClaim, sn *simNodes, node string) []int {
	t.Helper()
	var idx []int
	for _, r := range c.Status.Allocation.Devices.Results {
		found := false
		for _, d := range sn.invs[node].Devices {
			if dra.DeviceName(d.ID) == r.Device && r.Pool == node {
				idx, found = append(idx, d.Index), true
			}
		}
		if !found {
			t.Errorf("claim %s: device %s/%s is not one of node %s's", c.Name, r.Pool, r.Device, node)
		}
	}
	slices.Sort(idx)
	return idx
}

// TestClaimJobLandsOnNVLinkQuad: the two pods of a Job that take four
// kubegpu GPUs each through a ResourceClaimTemplate get the two all-NVLink
// quads of a DGX-1, written into their claims' standard allocation with
// kubegpu's signature. The stock allocator, in slice order, would give
// the first four GPUs and then the next four as well: the test's second
// half checks kubegpu's choice where first-fit differs, a quad left after
// a pod took GPU 0.
func TestClaimJobLandsOnNVLinkQuad(t *testing.T) {
	ctx := context.Background()
	_, nodes, ns := claimNodes(ctx, t, "claimquad", "dgx1", 1)
	client := tenant(t, ns)

	// One GPU first, as a claim: GPU 0 or another, the quads must stay.
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one"}, Spec: gpuClaimSpec(1)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPods(ctx, t, ns, claimUser("one", "one", false))
	settle(ctx, t, ns, time.Second, time.Minute)

	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "quad"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: gpuClaimSpec(4)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := claimUser("", "quad", true)
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train"}, Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](1), Completions: ptr.To[int32](1),
		Template: corev1.PodTemplateSpec{Spec: tmpl.Spec}}}
	if _, err := client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var bound []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=train"})
		if err != nil {
			return false, nil
		}
		bound = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Spec.NodeName == "" })
		return len(bound) == 1, nil
	}); err != nil {
		t.Fatalf("the Job's pod was not bound: %v\n%s", err, strings.Join(failedSchedulingAll(ctx, t, ns), "\n"))
	}
	one, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "one", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	single := claimedIndexes(t, claimOf(ctx, t, ns, one), nodes, one.Spec.NodeName)
	quad := claimedIndexes(t, claimOf(ctx, t, ns, &bound[0]), nodes, bound[0].Spec.NodeName)
	if len(single) != 1 {
		t.Fatalf("claim one got GPUs %v, want one", single)
	}
	want := "[4 5 6 7]"
	if single[0] >= 4 {
		want = "[0 1 2 3]"
	}
	t.Logf("single GPU %v, the Job's claim %v", single, quad)
	if fmt.Sprint(quad) != want {
		t.Errorf("the Job's claim got GPUs %v beside the single GPU %v; want the free all-NVLink quad %s", quad, single, want)
	}
	// The pod itself carries no allocation of its own.
	if _, has := bound[0].Annotations[kubeinterface.AnnotationAllocation]; has {
		t.Errorf("the claim-only pod carries an allocation annotation")
	}
}

// TestClaimAndAnnotationPodsNeverShare: kubegpu's claims and pods with
// kubegpu's annotations draw on one set of GPUs: neither gets a GPU the
// other holds, also after the scheduler restarts (it counts the claims'
// signed allocations), what fits nowhere waits, and a claim released (its pod
// deleted, the claim deallocated) frees its GPUs for a waiting pod. A
// tenant cannot write a claim's allocation itself.
func TestClaimAndAnnotationPodsNeverShare(t *testing.T) {
	ctx := context.Background()
	sched, nodes, ns := claimNodes(ctx, t, "claimshare", "t4x4", 1)
	client := tenant(t, ns)
	for _, name := range []string{"c2", "c1"} {
		count := int64(2)
		if name == "c1" {
			count = 1
		}
		if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: gpuClaimSpec(count)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPods(ctx, t, ns, claimUser("claim2", "c2", false), gpuPod("annot2", 2, 0, 0, nil))
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	var claimPod corev1.Pod
	var annotated []corev1.Pod
	for _, p := range pods {
		if p.Name == "claim2" {
			claimPod = p
		} else {
			annotated = append(annotated, p)
		}
	}
	allocs := checkAllocations(t, annotated, nodes.invs)
	if claimPod.Spec.NodeName == "" || allocs["annot2"].Node == "" {
		t.Fatalf("pods not bound: %v", failedSchedulingAll(ctx, t, ns))
	}
	node := claimPod.Spec.NodeName
	c2 := claimOf(ctx, t, ns, &claimPod)
	byClaim := claimedIndexes(t, c2, nodes, node)
	var byPod []int
	for _, d := range allocs["annot2"].Containers[0].Devices {
		for _, dev := range nodes.invs[node].Devices {
			if dev.ID == d.ID {
				byPod = append(byPod, dev.Index)
			}
		}
	}
	t.Logf("claim c2 holds GPUs %v, pod annot2 GPUs %v", byClaim, byPod)
	for _, i := range byClaim {
		if slices.Contains(byPod, i) {
			t.Errorf("GPU %d is held by claim c2 and by pod annot2", i)
		}
	}

	// A tenant may not write the allocation of its own claim.
	forged := c2.DeepCopy()
	forged.Status.Allocation.Devices.Results = forged.Status.Allocation.Devices.Results[:1]
	if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); err == nil {
		t.Errorf("the tenant rewrote its claim's allocation")
	}

	// A scheduler started afresh counts the claim's GPUs from its signed
	// allocation: the node is full, one more GPU fits nowhere, by claim
	// or by pod.
	if err := sched.Kill(); err != nil {
		t.Fatal(err)
	}
	startScheduler(ctx, t)
	createPods(ctx, t, ns, claimUser("claim1", "c1", false), gpuPod("annot1", 1, 0, 0, nil))
	for _, name := range []string{"claim1", "annot1"} {
		waitUnschedulable(ctx, t, ns, name, "not enough free GPUs")
	}
	// kubegpu explain judges the claim-based pod as the scheduler does:
	// the GPUs the claim holds are taken.
	out := kubegpu(t, "explain", "-n", ns, "claim1")
	for _, want := range []string{"claim/gpu/gpus", "ResourceClaim(s) of kubegpu's DeviceClass", "whole devices free"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubegpu explain of the claim-based pod does not say %q:\n%s", want, out)
		}
	}
	// kubegpu gpus lists the claim's GPUs as held by it, for its pod.
	var rows []struct {
		Node  string   `json:"node"`
		Index int      `json:"index"`
		Pods  []string `json:"pods"`
	}
	js, err := exec.Command(filepath.Join(binDir, "kubegpu"), "--kubeconfig", viewer.Kubeconfig, "--allocation-key", pubFile, "gpus", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &rows); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, r := range rows {
		if r.Node == node && slices.Contains(r.Pods, ns+"/claim2 (claim c2)") {
			held++
			if !slices.Contains(byClaim, r.Index) {
				t.Errorf("kubegpu gpus: GPU %d of %s held by claim c2, which holds %v", r.Index, node, byClaim)
			}
		}
	}
	if held != len(byClaim) {
		t.Errorf("kubegpu gpus lists %d GPUs held by claim c2, want %d", held, len(byClaim))
	}
	// The claim's pod goes; the controller deallocates the claim; both
	// waiting pods get the two GPUs it held.
	deletePod(ctx, t, ns, "claim2", true)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var bound int
		for _, name := range []string{"claim1", "annot1"} {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 2, nil
	}); err != nil {
		t.Fatalf("the waiting pods did not get the released claim's GPUs: %v\n%s", err, strings.Join(failedSchedulingAll(ctx, t, ns), "\n"))
	}
	claim1, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "claim1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	annot1, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "annot1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a1 := checkAllocations(t, []corev1.Pod{*annot1}, nodes.invs)["annot1"]
	got := claimedIndexes(t, claimOf(ctx, t, ns, claim1), nodes, node)
	for _, d := range a1.Containers[0].Devices {
		for _, dev := range nodes.invs[node].Devices {
			if dev.ID == d.ID && (slices.Contains(got, dev.Index) || slices.Contains(byPod, dev.Index)) {
				t.Errorf("GPU %d given twice: claim c1 %v, pod annot2 %v, pod annot1", dev.Index, got, byPod)
			}
		}
	}
	for _, i := range got {
		if slices.Contains(byPod, i) {
			t.Errorf("claim c1 got GPU %d, which pod annot2 holds", i)
		}
	}
}

// TestPodWithClaimOfEachKind: a pod with a claim for kubegpu's GPUs and one
// for another driver's device gets both: the first allocated by kubegpu
// (signed), the second by the stock DynamicResources plugin beside it.
func TestPodWithClaimOfEachKind(t *testing.T) {
	ctx := context.Background()
	_, nodes, ns := claimNodes(ctx, t, "claimmix", "dgx1", 1)
	node := nodes.names[0]
	const nicDriver = "nic.example.com"
	nodeClient, err := kubernetes.NewForConfig(nodes.kubelets[node].Identity.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeClient.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-nic"},
		Spec: resourceapi.ResourceSliceSpec{Driver: nicDriver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "nic0"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().ResourceSlices().Delete(context.Background(), node+"-nic", metav1.DeleteOptions{})
	})
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nicDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", nicDriver)}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.ResourceV1().DeviceClasses().Delete(context.Background(), nicDriver, metav1.DeleteOptions{})
	})
	client := tenant(t, ns)
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: gpuClaimSpec(2)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "nic"}, Spec: resourceapi.ResourceClaimSpec{
		Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicDriver}}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := claimUser("both", "gpus", false)
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "nic", ResourceClaimName: ptr.To("nic")})
	p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: "nic"})
	createPods(ctx, t, ns, p)
	pods := settle(ctx, t, ns, time.Second, time.Minute)
	if len(pods) != 1 || pods[0].Spec.NodeName != node {
		t.Fatalf("pod not bound to %s: %v", node, failedSchedulingAll(ctx, t, ns))
	}
	gpus := claimedIndexes(t, claimOf(ctx, t, ns, &pods[0]), nodes, node)
	if len(gpus) != 2 {
		t.Errorf("claim gpus got GPUs %v, want two", gpus)
	}
	nic, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "nic", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nic.Status.Allocation == nil || len(nic.Status.Allocation.Devices.Results) != 1 || nic.Status.Allocation.Devices.Results[0].Device != "nic0" {
		t.Fatalf("claim nic: allocation %+v, want nic0", nic.Status.Allocation)
	}
	if _, _, err := dra.SignedValue(nic.Status.Allocation); err == nil {
		t.Errorf("the other driver's claim carries kubegpu's signed allocation")
	}
}

// waitUnschedulable waits until the pod's PodScheduled condition says it
// is unschedulable with a message containing want (the condition has the
// latest message; FailedScheduling events of one pod are kept as a series
// with the first message).
func waitUnschedulable(ctx context.Context, t *testing.T, ns, name, want string) {
	t.Helper()
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				last = c.Message
				return strings.Contains(c.Message, want), nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod %s/%s: not unschedulable for %q: %v (last: %q)", ns, name, want, err, last)
	}
}
