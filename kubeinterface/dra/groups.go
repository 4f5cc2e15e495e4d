package dra

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/kubegpu/kubegpu/types"
)

// maxExactGroupGPUs bounds the whole GPUs whose groups are found exactly
// (largest groups first, over every subset); above it they are grown
// greedily in inventory order.
const maxExactGroupGPUs = 16

// linkGroups names, per device of inv, the group of whole GPUs all
// pairwise joined by a fabric link (NVLink, NVSwitch, or XGMI one hop
// apart) that it belongs to: "nvlink-N", or "xgmi-N" where every link of
// the group is XGMI, numbered in the order of the groups' first GPUs. The
// largest such group is taken first, then the largest of the GPUs left,
// and so on (ties: the group whose GPUs come first in the inventory), so
// the groups do not depend on the order the GPUs are listed in where the
// largest groups are unique: a DGX-1's hybrid cube mesh gives its two
// NVLink quads whatever the order. A GPU in no group of two or more, and
// every partition, gets "".
func linkGroups(inv types.Inventory) []string {
	var whole []int // inventory positions of the whole GPUs
	pos := make(map[string]int, len(inv.Devices))
	for i, d := range inv.Devices {
		if d.Parent == "" {
			pos[d.ID] = len(whole)
			whole = append(whole, i)
		}
	}
	n := len(whole)
	// fabric[a][b]: 0 none, 1 NVLink or NVSwitch, 2 XGMI (indexes into whole).
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
		switch {
		case l.Kind == types.LinkNVLink || l.Kind == types.LinkNVSwitch:
			fabric[a][b], fabric[b][a] = 1, 1
		case l.Kind == types.LinkXGMI && l.Hops <= 1:
			fabric[a][b], fabric[b][a] = 2, 2
		}
	}
	var groups [][]int
	if n <= maxExactGroupGPUs {
		groups = exactGroups(fabric)
	} else {
		groups = greedyGroups(fabric)
	}
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	out := make([]string, len(inv.Devices))
	counts := map[string]int{}
	for _, g := range groups {
		kind := "xgmi"
		for _, a := range g {
			for _, b := range g {
				if a != b && fabric[a][b] != 2 {
					kind = "nvlink"
				}
			}
		}
		name := fmt.Sprintf("%s-%d", kind, counts[kind])
		counts[kind]++
		for _, a := range g {
			out[whole[a]] = name
		}
	}
	return out
}

// exactGroups takes the largest clique of fabric's graph, then the largest
// of the rest, while they have two or more members; each group's members
// ascending.
func exactGroups(fabric [][]uint8) [][]int {
	n := len(fabric)
	adj := make([]uint32, n)
	for a := range fabric {
		for b, k := range fabric[a] {
			if k != 0 {
				adj[a] |= 1 << b
			}
		}
	}
	clique := func(set uint32) bool {
		for rest := set; rest != 0; rest &= rest - 1 {
			a := bits.TrailingZeros32(rest)
			if set&^(1<<a)&^adj[a] != 0 {
				return false
			}
		}
		return true
	}
	// earlier: whether set a's members come first in the inventory
	// (the lowest member that differs is in a).
	earlier := func(a, b uint32) bool {
		d := a ^ b
		return d != 0 && a&(d&-d) != 0
	}
	var groups [][]int
	left := uint32(1)<<n - 1
	for {
		var best uint32
		for set := left; set != 0; set = (set - 1) & left {
			size, bestSize := bits.OnesCount32(set), bits.OnesCount32(best)
			if size < 2 || size < bestSize || (size == bestSize && !earlier(set, best)) || !clique(set) {
				continue
			}
			best = set
		}
		if best == 0 {
			return groups
		}
		var g []int
		for rest := best; rest != 0; rest &= rest - 1 {
			g = append(g, bits.TrailingZeros32(rest))
		}
		groups = append(groups, g)
		left &^= best
	}
}

// greedyGroups grows each group from the first GPU left, adding every
// later GPU linked to all its members.
func greedyGroups(fabric [][]uint8) [][]int {
	n := len(fabric)
	assigned := make([]bool, n)
	var groups [][]int
	for a := 0; a < n; a++ {
		if assigned[a] {
			continue
		}
		g := []int{a}
		for b := a + 1; b < n; b++ {
			if assigned[b] || slices.ContainsFunc(g, func(m int) bool { return fabric[m][b] == 0 }) {
				continue
			}
			g = append(g, b)
		}
		if len(g) < 2 {
			continue
		}
		for _, m := range g {
			assigned[m] = true
		}
		groups = append(groups, g)
	}
	return groups
}
