package devicecache

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
)

// TestNodeRefusingTheKey: a node whose shim says it does not verify with
// the scheduler's signing key gets no GPU pods (its containers would be
// refused their allocations, pod after pod); one that names the key, or
// names none (an older shim), does. Filter refuses it for good.
func TestNodeRefusingTheKey(t *testing.T) {
	c, key := testCache(t)
	c.signingKey = kubeinterface.NewKeySet(key).IDs()[0]
	logger := klog.Background()
	topo, err := simgpu.Preset("t4x4")
	if err != nil {
		t.Fatal(err)
	}
	r := wholeRequest(t, c, 1)
	for _, tt := range []struct {
		name   string
		keys   []string
		refuse bool
	}{
		{"says nothing", nil, false},
		{"names the key", []string{"ed25519:0123456789abcdef", c.signingKey}, false},
		{"names other keys", []string{"ed25519:0123456789abcdef"}, true},
	} {
		n := testNode(t, "n-"+strings.ReplaceAll(tt.name, " ", "-"), "t4x4")
		inv := simgpu.Inventory(topo, n.Name)
		inv.KeyIDs = tt.keys
		if err := objects.SetNodeInventory(n, inv); err != nil {
			t.Fatal(err)
		}
		c.UpdateNode(logger, n)
		c.UpdateLease(testLease(n.Name, testNow), false)
		var p devicescheduler.Placement
		_, err := c.Evaluate(named(n.Name), ptr(c.Input(ShapeKey{1}, r)), noHost, noHost, &p)
		if got := errors.Is(err, ErrKeyRefused); got != tt.refuse {
			t.Errorf("%s: Evaluate = %v, want refused %v", tt.name, err, tt.refuse)
		}
		if tt.refuse {
			r := Classify(err)
			if !r.Unresolvable || !strings.Contains(r.Message, c.signingKey) || strings.Contains(r.Message, "0123456789abcdef") {
				t.Errorf("%s: refusal %+v, want unresolvable naming the scheduler's key and nothing the node wrote", tt.name, r)
			}
			if r.Reason != ReasonNoInventory {
				t.Errorf("%s: pending reason %s", tt.name, r.Reason)
			}
		}
	}
}
