package gpulink

import (
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

func TestWeightOrder(t *testing.T) {
	// Best first: the order the issue tracker and the engine rely on.
	order := []types.Link{
		{Kind: types.LinkNVLink, Count: 18},
		{Kind: types.LinkNVLink, Count: 2},
		{Kind: types.LinkNVLink, Count: 1},
		{Kind: types.LinkNVSwitch},
		{Kind: types.LinkPCIeSwitch},
		{Kind: types.LinkHostBridge},
		{Kind: types.LinkCrossSocket},
	}
	for i := 1; i < len(order); i++ {
		if Weight(order[i-1]) <= Weight(order[i]) {
			t.Errorf("Weight(%+v) = %d, not above Weight(%+v) = %d", order[i-1], Weight(order[i-1]), order[i], Weight(order[i]))
		}
	}
	if w := Weight(order[0]); w != types.MaxLinkWeight {
		t.Errorf("Weight(NV18) = %d, want %d", w, types.MaxLinkWeight)
	}
	if w := Weight(types.Link{}); w != WeightCrossSocket {
		t.Errorf("Weight(unknown) = %d, want %d", w, WeightCrossSocket)
	}
}

// TestXGMIWeights: a direct XGMI link rates as NVLink does by its
// bandwidth (MI250X's in-package 200 GB/s as four links), GPUs of one hive
// further apart below NVSwitch and above PCIe.
func TestXGMIWeights(t *testing.T) {
	order := []types.Link{
		{Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 200000},
		{Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 100000},
		{Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 50000},
		{Kind: types.LinkNVSwitch},
		{Kind: types.LinkXGMI, Hops: 2},
		{Kind: types.LinkPCIeSwitch},
	}
	for i := 1; i < len(order); i++ {
		if Weight(order[i-1]) <= Weight(order[i]) {
			t.Errorf("Weight(%+v) = %d, not above Weight(%+v) = %d", order[i-1], Weight(order[i-1]), order[i], Weight(order[i]))
		}
	}
	for _, l := range []types.Link{{Kind: types.LinkXGMI}, {Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 50000}} {
		if w := Weight(l); w != WeightXGMIDirect {
			t.Errorf("Weight(%+v) = %d, want %d (one link, or bandwidth unknown)", l, w, WeightXGMIDirect)
		}
	}
	if w := Weight(types.Link{Kind: types.LinkXGMI, Hops: 1, BandwidthMBps: 1 << 40}); w != types.MaxLinkWeight {
		t.Errorf("Weight(huge XGMI) = %d, want %d", w, types.MaxLinkWeight)
	}
	if got := (types.Link{Kind: types.LinkXGMI, Hops: 2}).Label(); got != "XGMI2" {
		t.Errorf("Label = %q, want XGMI2", got)
	}
}
