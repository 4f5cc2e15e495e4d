package plugin

import (
	"testing"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/devicecachetest"
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

func testCache(t *testing.T, cfg ...func(*devicecache.Config)) (*devicecache.Cache, *kubeinterface.Key) {
	t.Helper()
	return devicecachetest.New(t, cfg...)
}

func wholeRequest(t *testing.T, c *devicecache.Cache, count int) *devicescheduler.Request {
	return cachetest.WholeRequest(t, c.Engine(), count)
}
