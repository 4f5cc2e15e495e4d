package amd

import (
	"path/filepath"
	"slices"
	"testing"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// TestEnginePrefersXGMI runs the allocation engine on the four-MI250 node
// (testdata/mi250-4): 2-GCD pods get the two GCDs of one module, linked at
// 200 GB/s, and a 4-GCD pod two modules whose GCDs are linked directly.
func TestEnginePrefersXGMI(t *testing.T) {
	topo, err := Discover(filepath.Join("testdata", "mi250-4"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := devicescheduler.New(devicescheduler.Config{Plugins: []types.SchedulerPlugin{NewScheduler()}})
	if err != nil {
		t.Fatal(err)
	}
	place := func(n *devicescheduler.Node, pod string, count int) []int {
		t.Helper()
		r, err := e.NewRequest(types.PodRequest{Containers: []types.ContainerRequest{{Name: "c", Count: count, Topology: types.TopologyRequired}}}, devicescheduler.Host{})
		if err != nil {
			t.Fatal(err)
		}
		var p devicescheduler.Placement
		if err := e.Evaluate(n, r, &p); err != nil {
			t.Fatalf("Evaluate(%s) = %v", pod, err)
		}
		if err := n.Assume(pod, p.Allocation(), r.Host); err != nil {
			t.Fatal(err)
		}
		d := p.Devices(0, nil)
		slices.Sort(d)
		return d
	}

	n, err := e.NewNode("mi250", topo.Inventory, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	modules := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}
	var got [][]int
	for _, pod := range []string{"a", "b", "c", "d"} {
		d := place(n, pod, 2)
		if !slices.ContainsFunc(modules, func(m []int) bool { return slices.Equal(m, d) }) {
			t.Fatalf("pod %s got GCDs %v, want both GCDs of one module", pod, d)
		}
		for _, g := range got {
			if slices.Equal(g, d) {
				t.Fatalf("pod %s got GCDs %v, given already", pod, d)
			}
		}
		got = append(got, d)
	}

	// A 4-GCD pod: two whole modules with four direct links, GCDs 0-3 or
	// 4-7: each GCD is linked to one of the other module (50 GB/s), on one
	// NUMA node. The set AMD's guide suggests, 0,1,6,7, has three (one at
	// 100 GB/s) and spans both NUMA nodes: the engine weighs links pair by
	// pair, and four direct links outweigh one faster one.
	n, err = e.NewNode("mi250", topo.Inventory, devicescheduler.Host{})
	if err != nil {
		t.Fatal(err)
	}
	d := place(n, "quad", 4)
	m := topo.Inventory.LinkMatrix()
	direct := 0
	for i, a := range d {
		for _, b := range d[i+1:] {
			if l := m[a][b]; l.Kind == types.LinkXGMI && l.Hops == 1 {
				direct++
			}
		}
	}
	if direct < 4 || (d[0]/2 == d[2]/2) || d[0]/2 != d[1]/2 || d[2]/2 != d[3]/2 {
		t.Errorf("a 4-GCD pod got %v (%d direct links), want two whole modules with four direct links", d, direct)
	}
}
