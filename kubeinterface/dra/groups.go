package dra

import (
	"fmt"

	"github.com/kubegpu/kubegpu/types"
)

// linkGroups names, per device of inv, the group of whole GPUs all
// pairwise joined by a fabric link (NVLink, NVSwitch, or XGMI one hop
// apart) that it belongs to: "nvlink-N", or "xgmi-N" where every link of
// the group is XGMI. Groups are grown greedily in inventory order, so the
// same inventory always gives the same groups; a GPU in no group of two
// or more, and every partition, gets "". On a DGX-1 (hybrid cube mesh)
// that is its two NVLink quads.
func linkGroups(inv types.Inventory) []string {
	n := len(inv.Devices)
	pos := make(map[string]int, n)
	for i, d := range inv.Devices {
		pos[d.ID] = i
	}
	// fabric[i][j]: 0 none, 1 NVLink or NVSwitch, 2 XGMI.
	fabric := make([][]uint8, n)
	for i := range fabric {
		fabric[i] = make([]uint8, n)
	}
	for _, l := range inv.Links {
		a, okA := pos[l.A]
		b, okB := pos[l.B]
		if !okA || !okB {
			continue
		}
		var k uint8
		switch {
		case l.Kind == types.LinkNVLink || l.Kind == types.LinkNVSwitch:
			k = 1
		case l.Kind == types.LinkXGMI && l.Hops <= 1:
			k = 2
		default:
			continue
		}
		fabric[a][b], fabric[b][a] = k, k
	}
	out := make([]string, n)
	assigned := make([]bool, n)
	counts := map[string]int{}
	for i := range inv.Devices {
		if assigned[i] || inv.Devices[i].Parent != "" {
			continue
		}
		group := []int{i}
		xgmiOnly := true
		for j := i + 1; j < n; j++ {
			if assigned[j] || inv.Devices[j].Parent != "" {
				continue
			}
			joined := true
			for _, g := range group {
				if fabric[g][j] == 0 {
					joined = false
					break
				}
			}
			if !joined {
				continue
			}
			for _, g := range group {
				if fabric[g][j] != 2 {
					xgmiOnly = false
				}
			}
			group = append(group, j)
		}
		if len(group) < 2 {
			continue
		}
		kind := "nvlink"
		if xgmiOnly {
			kind = "xgmi"
		}
		name := fmt.Sprintf("%s-%d", kind, counts[kind])
		counts[kind]++
		for _, g := range group {
			assigned[g] = true
			out[g] = name
		}
	}
	return out
}
