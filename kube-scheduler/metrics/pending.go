package metrics

import (
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"

	ktypes "k8s.io/apimachinery/pkg/types"
)

// PendingPods are the GPU pods this scheduler has tried and not placed,
// with why: one entry per pod that exists unbound, removed when the pod
// is reserved, bound or deleted.
type PendingPods struct {
	mu   sync.Mutex
	pods map[ktypes.UID]*PendingPod
}

// PendingPod is one pod's last cycle: how many nodes refused it for each
// Reason (Filter counts them concurrently), or the reason it was refused
// outright.
type PendingPod struct {
	nodes [devicecache.NumReasons]atomic.Int32
	fixed atomic.Int32 // reason+1 when refused before Filter
}

// NewPendingPods tracks no pod yet.
func NewPendingPods() *PendingPods { return &PendingPods{pods: map[ktypes.UID]*PendingPod{}} }

// Start begins a cycle of pod: its counts start again.
func (p *PendingPods) Start(uid ktypes.UID) *PendingPod {
	pp := &PendingPod{}
	p.mu.Lock()
	p.pods[uid] = pp
	p.mu.Unlock()
	return pp
}

// Refuse records pod refused before Filter for reason.
func (p *PendingPods) Refuse(uid ktypes.UID, reason devicecache.Reason) {
	p.Start(uid).fixed.Store(int32(reason) + 1)
}

// Remove forgets a pod reserved, bound or deleted.
func (p *PendingPods) Remove(uid ktypes.UID) {
	p.mu.Lock()
	delete(p.pods, uid)
	p.mu.Unlock()
}

// Count records one node's refusal; nil-safe.
func (pp *PendingPod) Count(reason devicecache.Reason) {
	if pp != nil {
		pp.nodes[reason].Add(1)
	}
}

// Reason is why the pod waits: the reason it was refused outright, else
// the reason most nodes gave.
func (pp *PendingPod) Reason() devicecache.Reason {
	if r := pp.fixed.Load(); r > 0 {
		return devicecache.Reason(r - 1)
	}
	best, most := devicecache.ReasonOther, int32(0)
	for r := range pp.nodes {
		if n := pp.nodes[r].Load(); n > most {
			best, most = devicecache.Reason(r), n
		}
	}
	return best
}

// byReason counts the pending pods per reason.
func (p *PendingPods) byReason() [devicecache.NumReasons]int {
	var out [devicecache.NumReasons]int
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pp := range p.pods {
		out[pp.Reason()]++
	}
	return out
}

// prune drops the pending pods the informer (pods) no longer holds
// unbound: a pod deleted between the scheduling queue's pop and PreFilter
// would otherwise be counted for ever.
func (p *PendingPods) prune(pods []*corev1.Pod) {
	unbound := make(map[ktypes.UID]bool, len(pods))
	for _, pod := range pods {
		if pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil {
			unbound[pod.UID] = true
		}
	}
	p.mu.Lock()
	for uid := range p.pods {
		if !unbound[uid] {
			delete(p.pods, uid)
		}
	}
	p.mu.Unlock()
}
