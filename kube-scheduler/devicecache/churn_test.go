package devicecache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestCacheChurn's size: nodes created and deleted per round (a large
// cluster's worth), and rounds. About a second per round, most of it the
// cache decoding the nodes' inventories.
const (
	churnNodes  = 10000
	churnRounds = 2
)

// The ways a node of TestCacheChurn goes; the pod is the one GPU pod
// reserved there, if any.
const (
	nodeThenLease       = iota // no pod: Node deleted, then Lease
	leaseThenNode              // no pod: Lease deleted, then Node
	podFinishesFirst           // the bound pod finishes, then Node and Lease go
	podDeletedAfter            // Node and Lease go, then the bound pod is deleted
	leasePodNode               // Lease, then the bound pod, then Node
	unreservedAfter            // the pod is only assumed: Node and Lease go, then it is unreserved
	updatedAndWaitedFor        // the Node is updated again, pods wait for it; Node and Lease go, then the bound pod finishes and the waiting pods are deleted
	leaseOnly                  // only a Lease was seen: it is deleted
	numChurnWays
)

// TestCacheChurn: round after round, thousands of nodes come, are
// evaluated and given pods (reserved, bound, learned in the mix), and go,
// in every order (Node or Lease first, pods gone before or after their
// node, an assumed pod unreserved once its node went). After each round
// the cache holds nothing of them: no node, Node object, pod, waiting pod
// or learned pod, and no more shapes than the shapes evaluated. Counted
// exactly, rather than by the heap's size, which would have to be given
// a margin.
func TestCacheChurn(t *testing.T) {
	c, key := testCache(t)
	logger := klog.Background()
	c.learnState = learned // bound pods are learned as they are seen
	requests := map[ShapeKey]*devicescheduler.Request{{1}: wholeRequest(t, c, 1), {2}: wholeRequest(t, c, 2), {4}: wholeRequest(t, c, 4)}
	hostOnly, err := c.engine.NewRequest(types.PodRequest{}, devicescheduler.Host{CPUMilli: 1000, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var p devicescheduler.Placement
	// evaluate is Filter on node for every shape, and for a pod without
	// devices; fit says whether the node is idle, so that all must fit.
	evaluate := func(node *corev1.Node, fit bool) {
		t.Helper()
		for shape, r := range requests {
			in := c.Input(shape, r)
			if _, err := c.Evaluate(node, &in, noHost, noHost, &p); err != nil && (fit || !errors.Is(err, devicescheduler.ErrDoesNotFit)) {
				t.Fatalf("Evaluate %d GPUs on %s: %v", shape[0], node.Name, err)
			}
		}
		in := c.HostOnlyInput(hostOnly, hostOnly.Host)
		if _, err := c.EvaluateHostOnly(node, &in, noHost, noHost, &p); err != nil {
			t.Fatalf("EvaluateHostOnly on %s: %v", node.Name, err)
		}
	}
	known := func(name string) bool {
		c.mu.RLock()
		defer c.mu.RUnlock()
		_, ok := c.nodes[name]
		return ok
	}

	// The Node objects, built once for every round (the cache holds none
	// between rounds).
	built := make([]*corev1.Node, churnNodes)
	for i := range built {
		built[i] = testNode(t, fmt.Sprintf("n%d", i), "t4x4")
	}
	type churned struct {
		name  string
		way   int
		pod   *corev1.Pod // bound, or only assumed (unreservedAfter)
		waits []*corev1.Pod
	}
	for round := range churnRounds {
		rng := rand.New(rand.NewPCG(uint64(round), 2))
		all := make([]churned, churnNodes)
		for i := range all {
			n := &all[i]
			// Each round a node of a given index goes another way.
			n.name, n.way = built[i].Name, (i+round)%numChurnWays
			lease := testLease(n.name, testNow)
			if n.way == leaseOnly {
				c.UpdateLease(lease, false)
				continue
			}
			node := built[i]
			c.UpdateNode(logger, node)
			c.UpdateLease(lease, false)
			evaluate(node, true)
			if n.way == updatedAndWaitedFor {
				// The kubelet's status update: a new object, the same
				// inventory. Filter may still hold the old one.
				again := node.DeepCopy()
				c.UpdateNode(logger, again)
				evaluate(node, true)
				evaluate(again, true)
				for j, wait := range []func(*corev1.Pod){c.WaitForDevices, c.WaitForHeartbeat} {
					pod := testPod(fmt.Sprintf("%s-w%d", n.name, j))
					wait(pod)
					n.waits = append(n.waits, pod)
				}
			}
			if n.way == nodeThenLease || n.way == leaseThenNode {
				continue
			}
			// As the plugin's Reserve does: the pod joins the learned mix,
			// and the cache assumes its devices.
			pod := gpuPod(n.name+"-p", 1, 0, testNow)
			r := requests[ShapeKey{1}]
			c.engine.ObservePod(string(pod.UID), r, pod.CreationTimestamp.Time)
			alloc, err := c.Reserve(pod, n.name, r, noHost, noHost, nil)
			if err != nil {
				t.Fatalf("Reserve on %s: %v", n.name, err)
			}
			n.pod = pod
			if n.way != unreservedAfter {
				n.pod = boundWith(t, key, pod, alloc)
				if i%2 == 0 {
					// Bound by this scheduler: confirmed without a check.
					c.Written(pod.UID, n.pod.Annotations[kubeinterface.AnnotationAllocation])
				}
				c.UpdatePod(logger, n.pod)
			}
			evaluate(node, false)
		}
		if len(c.nodes) != churnNodes {
			t.Fatalf("round %d: the cache holds %d nodes, want %d", round, len(c.nodes), churnNodes)
		}

		// Nodes go in random order, each its own way.
		finish := func(pod *corev1.Pod) {
			done := pod.DeepCopy()
			done.Status.Phase = corev1.PodSucceeded
			c.UpdatePod(logger, done)
		}
		for _, i := range rng.Perm(len(all)) {
			n := &all[i]
			lease := testLease(n.name, testNow)
			switch n.way {
			case nodeThenLease:
				c.DeleteNode(n.name)
				c.DeleteLease(lease)
			case leaseThenNode, leaseOnly:
				c.DeleteLease(lease)
				c.DeleteNode(n.name)
			case podFinishesFirst:
				finish(n.pod)
				c.DeleteNode(n.name)
				c.DeleteLease(lease)
			case podDeletedAfter:
				c.DeleteNode(n.name)
				c.DeleteLease(lease)
				if !known(n.name) {
					t.Fatalf("round %d: %s was forgotten while its pod is counted there", round, n.name)
				}
				c.Forget(logger, n.pod.UID)
			case leasePodNode:
				c.DeleteLease(lease)
				c.Forget(logger, n.pod.UID)
				c.DeleteNode(n.name)
			case unreservedAfter:
				c.DeleteNode(n.name)
				c.DeleteLease(lease)
				// As the plugin's Unreserve does (binding failed: the
				// node is gone).
				c.engine.ForgetPod(string(n.pod.UID))
				c.Unreserve(n.pod.UID)
			case updatedAndWaitedFor:
				c.DeleteNode(n.name)
				c.DeleteLease(lease)
				finish(n.pod)
				for _, w := range n.waits {
					c.Forget(logger, w.UID)
				}
			}
			if known(n.name) {
				t.Fatalf("round %d: %s (way %d) is kept after its Node, Lease and pods went", round, n.name, n.way)
			}
		}
		checkChurnedAway(t, c, round, len(requests))
	}
}

// checkChurnedAway fails unless c holds nothing of the nodes and pods
// that came and went: it is as a cache that never saw them.
func checkChurnedAway(t *testing.T, c *Cache, round, shapes int) {
	t.Helper()
	c.mu.RLock()
	nodes, objects, pods := len(c.nodes), len(c.byObject), len(c.pods)
	c.mu.RUnlock()
	waiting := func(w *waitSet) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.pods)
	}
	c.shapeMu.Lock()
	numShapes := len(c.shapes)
	c.shapeMu.Unlock()
	for _, got := range []struct {
		what      string
		n, atMost int
	}{
		{"nodes", nodes, 0},
		{"Node objects", objects, 0},
		{"pods", pods, 0},
		{"pods waiting for a live node", waiting(c.liveWaiters), 0},
		{"pods waiting for devices", waiting(c.deviceWaiters), 0},
		{"pods in the learned mix", c.engine.LearnedPods(), 0},
		{"task types in the learned mix", len(c.engine.Workload().Types()), 0},
		{"request shapes", numShapes, shapes},
	} {
		if got.n > got.atMost {
			t.Errorf("round %d: once every node and pod went the cache holds %d %s, want at most %d", round, got.n, got.what, got.atMost)
		}
	}
}
