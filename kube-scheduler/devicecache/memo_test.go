package devicecache

import (
	"errors"
	"testing"

	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// TestShapeTableStartsOver: a full shape table starts over, and a shape
// number reused in the new epoch never returns an old shape's result.
func TestShapeTableStartsOver(t *testing.T) {
	c, _ := testCache(t)
	c.UpdateNode(klog.Background(), testNode(t, "n1", "t4x4"))
	c.UpdateLease(testLease("n1", testNow), false)
	var p devicescheduler.Placement
	tooBig := c.Input(ShapeKey{8}, wholeRequest(t, c, 8))
	if _, err := c.Evaluate(named("n1"), &tooBig, noHost, noHost, &p); !errors.Is(err, devicescheduler.ErrDoesNotFit) {
		t.Fatalf("8 GPUs on a T4x4: %v, want ErrDoesNotFit", err)
	}
	for i := len(c.shapes); i < maxShapeIDs; i++ {
		c.Input(ShapeKey{100, uint64(i)}, nil)
	}
	one := c.Input(ShapeKey{1}, wholeRequest(t, c, 1))
	if one.shape != tooBig.shape || one.epoch == tooBig.epoch {
		t.Fatalf("after the table filled: shape %d epoch %d, want number %d again in a new epoch", one.shape, one.epoch, tooBig.shape)
	}
	if _, err := c.Evaluate(named("n1"), &one, noHost, noHost, &p); err != nil {
		t.Errorf("1 GPU on an idle T4x4: %v (an old epoch's result?)", err)
	}
}

// TestRequestShapeResource: two requests alike but for the device
// resource have two shapes, so that the memo never answers an
// amd.com/gpu pod with an nvidia.com/gpu pod's nodes.
func TestRequestShapeResource(t *testing.T) {
	req := func(r string) types.PodRequest {
		return types.PodRequest{Containers: []types.ContainerRequest{{Name: "c", Count: 2, Selector: types.Selector{Resource: r}}}}
	}
	if RequestShape(req(types.ResourceNVIDIAGPU), devicescheduler.Host{}, "") == RequestShape(req(types.ResourceAMDGPU), devicescheduler.Host{}, "") {
		t.Error("nvidia.com/gpu and amd.com/gpu requests share a shape")
	}
}
