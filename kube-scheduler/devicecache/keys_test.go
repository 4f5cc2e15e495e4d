package devicecache

import (
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestNoKeysCountsNothing: a cache given no keys counts no allocation,
// however well formed, unless told to check their form only (explain
// without keys): it fails closed.
func TestNoKeysCountsNothing(t *testing.T) {
	key := cachetest.Key(t)
	signed := New(Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(key), Staleness: time.Hour})
	logger := klog.Background()
	signed.UpdateNode(logger, cachetest.Node(t, "n1", "t4x4"))
	signed.UpdateLease(cachetest.Lease("n1", time.Now()), false)
	pod := cachetest.Pod("p")
	alloc, err := signed.Reserve(pod, "n1", cachetest.WholeRequest(t, signed.engine, 2), noHost, noHost, nil)
	if err != nil {
		t.Fatal(err)
	}
	bound := cachetest.BoundWith(t, key, pod, alloc)
	for _, tc := range []struct {
		formOnly bool
		want     int
	}{{false, 0}, {true, 1}} {
		c := New(Config{Engine: cachetest.Engine(t), FormOnly: tc.formOnly, Staleness: time.Hour})
		c.UpdateNode(logger, cachetest.Node(t, "n1", "t4x4"))
		c.UpdatePod(logger, bound)
		if got := len(c.Snapshot()["n1"].Pods); got != tc.want {
			t.Errorf("FormOnly %v: %d pods counted, want %d", tc.formOnly, got, tc.want)
		}
	}
}
