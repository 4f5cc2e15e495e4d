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
