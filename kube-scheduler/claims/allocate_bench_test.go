package claims

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// BenchmarkAllocateAcrossNodes is Filter's check of a 1-GPU claim on each
// of 100 DGX-1s in turn, with one allocator (and its CEL cache) for all,
// as the scheduler runs it.
func BenchmarkAllocateAcrossNodes(b *testing.B) {
	type node struct {
		node  *corev1.Node
		inv   types.Inventory
		slice *resourceapi.ResourceSlice
	}
	t := &testing.T{}
	var nodes []node
	for i := range 100 {
		name := fmt.Sprint("n", i)
		inv, slice := dgx1(t, name)
		nodes = append(nodes, node{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, inv, slice})
	}
	a := newAllocator()
	pcs := []PodClaim{{Name: "g", Claim: claim("c", whole("gpu", 1))}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		n := nodes[i%len(nodes)]
		alloc := chose(n.inv, dra.ClaimEntry("g", "gpu"), types.DeviceShare{Exclusive: true}, i%8)
		alloc.Node = n.node.Name
		if _, err := a.Allocate(context.Background(), n.node, pcs, alloc, []*resourceapi.ResourceSlice{n.slice}, emptyState()); err != nil {
			b.Fatal(err)
		}
	}
}
