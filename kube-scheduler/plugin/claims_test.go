package plugin

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/kubegpu/kubegpu/kube-scheduler/claims"
)

// TestAllocateStatus: the allocator's check refuses a node, never the
// cycle, when it fails for the node or because the scheduler stopped
// filtering (it cancels Filter's context once it has found enough nodes);
// any other failure is an error.
func TestAllocateStatus(t *testing.T) {
	ctx := context.Background()
	stopped, cancel := context.WithCancelCause(ctx)
	cancel(errors.New("findNodesThatPassFilters has found enough nodes"))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want fwk.Code
	}{
		{"allocated", ctx, nil, fwk.Success},
		{"rejected", ctx, fmt.Errorf("x: %w", claims.ErrRejected), fwk.Unschedulable},
		{"failed on node", ctx, fmt.Errorf("x: %w", structured.ErrFailedAllocationOnNode), fwk.Unschedulable},
		{"filtering stopped", stopped, errors.New("filter operation aborted"), fwk.Unschedulable},
		{"other", ctx, errors.New("bad CEL"), fwk.Error},
	} {
		if got := allocateStatus(tc.ctx, tc.err).Code(); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
