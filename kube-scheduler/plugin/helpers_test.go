package plugin

import (
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// The objects the tests feed the cache (see package cachetest).
var (
	testNow   = cachetest.Now
	named     = cachetest.Named
	testNode  = cachetest.Node
	testLease = cachetest.Lease
	testPod   = cachetest.Pod
	boundWith = cachetest.BoundWith
	gpuPod    = cachetest.GPUPod
	noHost    devicescheduler.Host
)

// testCache is a device cache over the simulated GPU module on the tests'
// clock, with cfg's changes applied.
func testCache(t *testing.T, cfg ...func(*devicecache.Config)) (*devicecache.Cache, *kubeinterface.Key) {
	t.Helper()
	key := cachetest.Key(t)
	c := devicecache.Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(key), Staleness: 40 * time.Second,
		Now: func() time.Time { return testNow }}
	for _, f := range cfg {
		f(&c)
	}
	var cache *devicecache.Cache
	c.ListPods = func() ([]*corev1.Pod, error) {
		if list, ok := testListPods.Load(cache); ok {
			return list.(func() ([]*corev1.Pod, error))()
		}
		return nil, nil
	}
	cache = devicecache.New(c)
	t.Cleanup(func() {
		for name, s := range cache.Snapshot() {
			if strings.HasPrefix(s.Usable, "memo out of date") {
				t.Errorf("node %s: %s", name, s.Usable)
			}
		}
	})
	return cache, key
}

func wholeRequest(t *testing.T, c *devicecache.Cache, count int) *devicescheduler.Request {
	return cachetest.WholeRequest(t, c.Engine(), count)
}

func ptr[T any](v T) *T { return &v }

// The tests' pending pods and pod lists, per cache.
var (
	testPending  sync.Map // *devicecache.Cache → *pendingPods
	testListPods sync.Map // *devicecache.Cache → func() ([]*corev1.Pod, error)
)

// pendingOf is the pending pods the tests count beside c.
func pendingOf(c *devicecache.Cache) *pendingPods {
	p, _ := testPending.LoadOrStore(c, newPendingPods())
	return p.(*pendingPods)
}

// setListPods makes list the pods c's informer holds.
func setListPods(c *devicecache.Cache, list func() ([]*corev1.Pod, error)) {
	testListPods.Store(c, list)
}

// reasonNames are the pending reasons' label values.
func reasonNames() []string {
	var out []string
	for r := range devicecache.NumReasons {
		out = append(out, r.String())
	}
	return out
}

// inventoryNames are the inventory states' label values.
func inventoryNames() []string {
	var out []string
	for s := range devicecache.NumInventoryStates {
		out = append(out, s.String())
	}
	return out
}
