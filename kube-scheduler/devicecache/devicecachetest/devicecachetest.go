// Package devicecachetest builds device caches for the tests of the
// packages that use one (the scheduler plugin, its metrics). It is for
// tests only.
package devicecachetest

import (
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// New is a device cache over the simulated GPU module, on the tests'
// clock (Now), with cfg's changes applied. At the end of the test no
// node's memo may be behind its devices.
func New(t testing.TB, cfg ...func(*devicecache.Config)) (*devicecache.Cache, *kubeinterface.Key) {
	t.Helper()
	key := cachetest.Key(t)
	c := devicecache.Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(key), Staleness: 40 * time.Second,
		Now: func() time.Time { return cachetest.Now }}
	for _, f := range cfg {
		f(&c)
	}
	cache := devicecache.New(c)
	t.Cleanup(func() {
		for name, s := range cache.Snapshot() {
			if strings.HasPrefix(s.Usable, "memo out of date") {
				t.Errorf("node %s: %s", name, s.Usable)
			}
		}
	})
	return cache, key
}
