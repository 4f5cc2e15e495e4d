package devicecache

import (
	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kube-scheduler/mix"
)

// learnState is how far the cache is with learning the workload mix.
type learnState int

const (
	// notLearning: the informers have not synced; pods are not learned.
	notLearning learnState = iota
	// learning: LearnPods is learning the pods listed; pods seen bound are
	// learned, and pods forgotten are remembered in gone.
	learning
	// learned: every bound pod seen is learned, and forgotten when it goes.
	learned
)

// LearnPods rebuilds the learned workload mix from the pods the cluster
// holds, as `kubegpu explain` does, so that a restarted scheduler, or a
// standby (which learns as the leader does), scores as one that had run
// all along; then has every pod seen from now on learned as it comes.
func (c *Cache) LearnPods(logger klog.Logger) {
	c.learnMu.Lock()
	c.learnState, c.gone = learning, map[ktypes.UID]struct{}{}
	c.learnMu.Unlock()
	pods, err := c.listPods()
	if err != nil {
		logger.Error(err, "Listing pods to learn the workload mix from; it is learned from the pods scheduled from now on")
	}
	mix.Learn(c.engine, pods, c.HasDevices, func(p *corev1.Pod) bool { return c.Holds(p.UID) })
	c.learnMu.Lock()
	gone := c.gone
	c.learnState, c.gone = learned, nil
	c.learnMu.Unlock()
	// Pods that went while they were learned from the list.
	for uid := range gone {
		c.engine.ForgetPod(string(uid))
	}
	logger.Info("Learned the workload mix from the pods running", "pods", c.engine.LearnedPods(), "types", len(c.engine.Workload().Types()))
}
