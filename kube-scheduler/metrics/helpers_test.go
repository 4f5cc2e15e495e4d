package metrics

import (
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/devicecachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// The objects the tests feed the cache (see package cachetest).
var (
	testNow   = cachetest.Now
	testNode  = cachetest.Node
	testLease = cachetest.Lease
	testPod   = cachetest.Pod
	boundWith = cachetest.BoundWith
	gpuPod    = cachetest.GPUPod
	noHost    devicescheduler.Host
)

// The tests' pending pods and pod lists, per cache.
var (
	testPending  sync.Map // *devicecache.Cache → *PendingPods
	testListPods sync.Map // *devicecache.Cache → func() ([]*corev1.Pod, error)
)

// testCache is cachetest.Cache listing the pods setListPods gives it.
func testCache(t *testing.T, cfg ...func(*devicecache.Config)) (*devicecache.Cache, *kubeinterface.Key) {
	t.Helper()
	var cache *devicecache.Cache
	list := func(c *devicecache.Config) {
		c.ListPods = func() ([]*corev1.Pod, error) {
			if list, ok := testListPods.Load(cache); ok {
				return list.(func() ([]*corev1.Pod, error))()
			}
			return nil, nil
		}
	}
	cache, key := devicecachetest.New(t, append([]func(*devicecache.Config){list}, cfg...)...)
	return cache, key
}

func wholeRequest(t *testing.T, c *devicecache.Cache, count int) *devicescheduler.Request {
	return cachetest.WholeRequest(t, c.Engine(), count)
}

// pendingOf is the pending pods the tests count beside c.
func pendingOf(c *devicecache.Cache) *PendingPods {
	p, _ := testPending.LoadOrStore(c, NewPendingPods())
	return p.(*PendingPods)
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
