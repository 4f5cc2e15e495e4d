package localcluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
)

// SimKubeletOptions configure a SimKubelet.
type SimKubeletOptions struct {
	// Node is the node's name.
	Node string
	// Capacity is the node's CPU, memory and pods (see NodeCapacity).
	Capacity corev1.ResourceList
	// LeaseDuration is written on the node's Lease, which is renewed every
	// quarter of it, kubelet's ratio (default 40s: renewed every 10s).
	LeaseDuration time.Duration
	// Clock is the clock whose time the Lease's renewals carry; a skewed
	// one stands in for a node whose clock is off (default: the real one).
	Clock clock.Clock
}

// SimKubelet stands in for the kubelet of a node that has none (a
// simulated GPU node): with the node's own credentials it registers the
// Node, reports it Ready, and renews the node's Lease in kube-node-lease
// with kubelet's own lease controller. kube-controller-manager then treats
// the node as it treats a real one (removes the not-ready taint, marks it
// unreachable when the renewals stop).
type SimKubelet struct {
	opts SimKubeletOptions
	// Identity is the node's credentials (system:node:NAME).
	Identity *Identity

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// StartSimKubelet registers the node (if missing) and starts renewing its
// Lease; it returns once the node is Ready and untainted.
func (c *Cluster) StartSimKubelet(ctx context.Context, opts SimKubeletOptions) (*SimKubelet, error) {
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 40 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	id, err := c.NodeIdentity(opts.Node)
	if err != nil {
		return nil, err
	}
	k := &SimKubelet{opts: opts, Identity: id}
	if err := k.register(ctx); err != nil {
		return nil, err
	}
	k.Resume()
	if err := c.waitSchedulable(ctx, opts.Node); err != nil {
		k.Pause()
		return nil, err
	}
	return k, nil
}

// register creates the Node as kubelet does and reports it Ready.
func (k *SimKubelet) register(ctx context.Context) error {
	nodes := k.Identity.Client.CoreV1().Nodes()
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.opts.Node,
		Labels: map[string]string{corev1.LabelHostname: k.opts.Node, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("localcluster: register node %s: %w", k.opts.Node, err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, k.opts.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		now := metav1.NewTime(k.opts.Clock.Now())
		for name, q := range k.opts.Capacity {
			if n.Status.Capacity == nil {
				n.Status.Capacity, n.Status.Allocatable = corev1.ResourceList{}, corev1.ResourceList{}
			}
			n.Status.Capacity[name], n.Status.Allocatable[name] = q, q
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	})
}

// Pause stops renewing the Lease, as a kubelet that died would.
func (k *SimKubelet) Pause() {
	k.mu.Lock()
	cancel, done := k.cancel, k.done
	k.cancel, k.done = nil, nil
	k.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Resume renews the Lease again (a no-op if it is being renewed).
func (k *SimKubelet) Resume() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel, k.done = cancel, make(chan struct{})
	seconds := int32(k.opts.LeaseDuration / time.Second)
	ctl := lease.NewController(k.opts.Clock, k.Identity.Client, k.opts.Node, seconds, nil,
		k.opts.LeaseDuration/4, k.opts.Node, corev1.NamespaceNodeLease, k.setOwner)
	go func(done chan struct{}) {
		defer close(done)
		ctl.Run(ctx)
	}(k.done)
}

// Restart does what a kubelet that starts again does: registers the node
// (reporting it Ready) and renews its Lease.
func (k *SimKubelet) Restart(ctx context.Context) error {
	k.Resume()
	return k.register(ctx)
}

// setOwner makes the Lease go with the Node, as kubelet's does.
func (k *SimKubelet) setOwner(l *coordinationv1.Lease) error {
	if len(l.OwnerReferences) > 0 {
		return nil
	}
	n, err := k.Identity.Client.CoreV1().Nodes().Get(context.Background(), k.opts.Node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
	return nil
}

// waitSchedulable waits until node is Ready, its kubelet has created its
// Lease, and kube-controller-manager removed the not-ready taint that
// admission puts on new nodes; without a controller-manager it removes the
// taint as cluster-admin.
func (c *Cluster) waitSchedulable(ctx context.Context, node string) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable
		})
		if tainted && c.opts.ControllerManager == "" {
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable
			})
			_, last = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return false, nil
		}
		if tainted {
			last = errors.New("kube-controller-manager has not removed the not-ready taint yet")
			return false, nil
		}
		if _, err := c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{}); err != nil {
			last = fmt.Errorf("node's Lease: %w", err)
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		last = errors.New("node not Ready")
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("localcluster: node %s not schedulable: %w (last: %w)", node, err, last)
	}
	return nil
}
