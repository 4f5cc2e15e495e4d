package devicescheduler

import "github.com/kubegpu/kubegpu/types"

// maxEnumerated bounds the device sets chooseWhole compares exhaustively;
// larger choices are built greedily.
const maxEnumerated = 512

// chooseWhole picks c.Count whole devices from cand: the set with the best
// interconnect that also cuts the fewest good links to the devices that stay
// free, so that the next multi-device pod still finds a well-connected set.
// With topology required, only sets whose every pair is joined by NVLink or
// NVSwitch qualify. It returns 0 when no set qualifies.
func chooseWhole(n *Node, s *State, c *Container, cand uint64) uint64 {
	k := c.Count
	free := n.Allocatable() &^ s.Used &^ s.Exclusive
	// rowFree[i]: the weight of i's links to the other free devices.
	var rowFree [MaxDevices]int
	var idx [MaxDevices]int
	m := 0
	for rest := cand; rest != 0; rest &= rest - 1 {
		i := trailing(rest)
		idx[m] = i
		m++
		row := n.weight[i*n.n : (i+1)*n.n]
		for f := free &^ (1 << i); f != 0; f &= f - 1 {
			rowFree[i] += int(row[trailing(f)])
		}
	}
	required := c.Topology == types.TopologyRequired
	if k == 1 {
		// Take the device whose loss hurts the free pool least.
		best, bestScore := uint64(0), 0
		for j := 0; j < m; j++ {
			i := idx[j]
			if sc := -rowFree[i]; best == 0 || sc > bestScore {
				best, bestScore = 1<<i, sc
			}
		}
		return best
	}
	if binomial(m, k) <= maxEnumerated {
		return enumerate(n, idx[:m], k, &rowFree, required)
	}
	return greedy(n, idx[:m], k, &rowFree, required)
}

// setScore rates a device set: its internal links count four times, and
// every link it cuts from the devices left free counts against it. With
// cut = sum(rowFree) - 2*internal, 4*internal - cut = 6*internal - sum(rowFree).
func setScore(internal, rowSum int) int { return 6*internal - rowSum }

// enumerate tries every k-subset of idx.
func enumerate(n *Node, idx []int, k int, rowFree *[MaxDevices]int, required bool) uint64 {
	var pos [MaxDevices]int
	for i := 0; i < k; i++ {
		pos[i] = i
	}
	best, bestScore := uint64(0), 0
	for {
		var set uint64
		internal, rowSum := 0, 0
		ok := true
		for a := 0; a < k && ok; a++ {
			i := idx[pos[a]]
			set |= 1 << i
			rowSum += rowFree[i]
			row := n.weight[i*n.n : (i+1)*n.n]
			for b := a + 1; b < k; b++ {
				j := idx[pos[b]]
				if required && n.fastAdj[i]&(1<<j) == 0 {
					ok = false
					break
				}
				internal += int(row[j])
			}
		}
		if ok {
			if sc := setScore(internal, rowSum); best == 0 || sc > bestScore {
				best, bestScore = set, sc
			}
		}
		if !nextCombination(pos[:k], len(idx)) {
			return best
		}
	}
}

// nextCombination advances pos, k increasing positions in 0..n-1, to the
// next combination in lexicographic order; false when pos was the last.
func nextCombination(pos []int, n int) bool {
	k := len(pos)
	a := k - 1
	for a >= 0 && pos[a] == n-k+a {
		a--
	}
	if a < 0 {
		return false
	}
	pos[a]++
	for b := a + 1; b < k; b++ {
		pos[b] = pos[b-1] + 1
	}
	return true
}

// greedy grows a set from each seed device, adding the device with the
// strongest links into the set, and keeps the best complete set.
func greedy(n *Node, idx []int, k int, rowFree *[MaxDevices]int, required bool) uint64 {
	best, bestScore := uint64(0), 0
	for _, seed := range idx {
		set := uint64(1) << seed
		internal, rowSum := 0, rowFree[seed]
		for size := 1; size < k; size++ {
			pick, pickGain := -1, 0
			for _, j := range idx {
				if set&(1<<j) != 0 || (required && set&^n.fastAdj[j] != 0) {
					continue
				}
				gain := 0
				for s := set; s != 0; s &= s - 1 {
					gain += int(n.weight[j*n.n+trailing(s)])
				}
				if pick < 0 || 6*gain-rowFree[j] > 6*pickGain-rowFree[pick] {
					pick, pickGain = j, gain
				}
			}
			if pick < 0 {
				set = 0
				break
			}
			set |= 1 << pick
			internal += pickGain
			rowSum += rowFree[pick]
		}
		if set == 0 {
			continue
		}
		if sc := setScore(internal, rowSum); best == 0 || sc > bestScore {
			best, bestScore = set, sc
		}
	}
	return best
}

// chooseSlices picks c.Count distinct devices from cand for slices: the ones
// the policy rates highest. With topology required and more than one slice,
// the devices must also be pairwise joined by NVLink or NVSwitch.
func chooseSlices(n *Node, s *State, c *Container, cand uint64, pol Policy, scores *[MaxDevices]int64) uint64 {
	pol.ScoreDevices(n, s, c, cand, scores)
	if c.Count > 1 && c.Topology == types.TopologyRequired {
		return bestConnectedSlices(n, cand, c.Count, scores)
	}
	var chosen uint64
	for k := 0; k < c.Count; k++ {
		pick := -1
		for rest := cand &^ chosen; rest != 0; rest &= rest - 1 {
			d := trailing(rest)
			if pick < 0 || scores[d] > scores[pick] {
				pick = d
			}
		}
		chosen |= 1 << pick
	}
	return chosen
}

// bestConnectedSlices picks the fully NVLink/NVSwitch-connected k-subset of
// cand with the highest total device score: exhaustively when there are at
// most maxEnumerated subsets, else growing greedily from each seed (which
// may miss a connected set on unusual link graphs).
func bestConnectedSlices(n *Node, cand uint64, k int, scores *[MaxDevices]int64) uint64 {
	var idx [MaxDevices]int
	m := 0
	for rest := cand; rest != 0; rest &= rest - 1 {
		idx[m] = trailing(rest)
		m++
	}
	if binomial(m, k) > maxEnumerated {
		return greedyConnectedSlices(n, cand, k, scores)
	}
	var pos [MaxDevices]int
	for i := 0; i < k; i++ {
		pos[i] = i
	}
	best, bestScore := uint64(0), int64(0)
	for {
		var set uint64
		var total int64
		for a := 0; a < k; a++ {
			i := idx[pos[a]]
			set |= 1 << i
			total += scores[i]
		}
		connected := true
		for rest := set; rest != 0 && connected; rest &= rest - 1 {
			i := trailing(rest)
			connected = set&^(1<<i)&^n.fastAdj[i] == 0
		}
		if connected && (best == 0 || total > bestScore) {
			best, bestScore = set, total
		}
		if !nextCombination(pos[:k], m) {
			return best
		}
	}
}

// greedyConnectedSlices grows a connected set from each seed device,
// adding the best-scored device joined to all of the set, and keeps the best
// complete set.
func greedyConnectedSlices(n *Node, cand uint64, k int, scores *[MaxDevices]int64) uint64 {
	best, bestScore := uint64(0), int64(0)
	for seeds := cand; seeds != 0; seeds &= seeds - 1 {
		seed := trailing(seeds)
		set, total := uint64(1)<<seed, scores[seed]
		for size := 1; size < k; size++ {
			pick := -1
			for rest := cand &^ set; rest != 0; rest &= rest - 1 {
				j := trailing(rest)
				if set&^n.fastAdj[j] == 0 && (pick < 0 || scores[j] > scores[pick]) {
					pick = j
				}
			}
			if pick < 0 {
				set = 0
				break
			}
			set |= 1 << pick
			total += scores[pick]
		}
		if set != 0 && (best == 0 || total > bestScore) {
			best, bestScore = set, total
		}
	}
	return best
}

// binomial is n choose k, saturating above maxEnumerated.
func binomial(n, k int) int {
	if k < 0 || k > n {
		return 0
	}
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i
		if r > maxEnumerated {
			return maxEnumerated + 1
		}
	}
	return r
}
