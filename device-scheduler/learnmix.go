package devicescheduler

import (
	"cmp"
	"encoding/binary"
	"hash"
	"hash/maphash"
	"io"
	"math"
	"math/bits"
	"slices"
)

// key hashes a task type. The hash is seeded per learner: nobody can make
// two types collide on purpose.
func (l *workloadLearner) key(t *TaskType) shapeKey {
	var out shapeKey
	for i := range out {
		var h maphash.Hash
		h.SetSeed(l.seeds[i])
		hashType(&h, t)
		out[i] = h.Sum64()
	}
	return out
}

// hashType writes what identifies a task type to h, each field's length
// first so that no two types write the same bytes.
func hashType(h hash.Hash64, t *TaskType) {
	var b [8]byte
	num := func(n int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
	}
	for _, n := range []int64{int64(t.Count), int64(t.Milli), t.MemoryMiB, t.Host.CPUMilli} {
		num(n)
	}
	if t.Exclusive {
		num(1)
	} else {
		num(0)
	}
	num(int64(len(t.Selector.Resource)))
	_, _ = io.WriteString(h, t.Selector.Resource) // a hash never fails to write
	for _, list := range [][]string{t.Selector.IncludeModels, t.Selector.ExcludeModels, t.Selector.IncludeUUIDs, t.Selector.ExcludeUUIDs} {
		num(int64(len(list)))
		for _, s := range list {
			num(int64(len(s)))
			_, _ = io.WriteString(h, s) // a hash never fails to write
		}
	}
}

// mix makes the mix from the types tracked: the weightiest device types
// that together cover learnedCoverage of the weight of all device types
// (FGD's "typical pods"; the other bucket counts as device types), at most
// maxLearnedTypes of them, and the type of the pods without devices.
// Weights are quantised to weightQuantum of the total and host requests to
// about 1%, so that equal pods give an equal mix.
func (l *workloadLearner) mix() ([]TaskType, []publishedType) {
	total := l.other
	for _, c := range l.types {
		total += c.Weight
	}
	if !(total > 0) {
		return nil, nil
	}
	type entry struct {
		t     TaskType
		pub   publishedType
		order uint64
	}
	var devices []entry
	var none *entry
	var deviceWeight int64
	for k, c := range l.types {
		q := int64(math.Round(c.Weight / total / weightQuantum))
		if q <= 0 || c.Weight <= 0 {
			continue
		}
		t := c.TaskType
		t.Host = Host{CPUMilli: roundHost(c.cpuMilli / c.Weight), MemoryMiB: roundHost(c.memoryMiB / c.Weight)}
		t.Weight = float64(q)
		e := entry{t: t, pub: publishedType{key: k, weight: q, host: t.Host}, order: c.order}
		if k == (shapeKey{}) {
			none = &e
			continue
		}
		devices = append(devices, e)
		deviceWeight += q
	}
	deviceWeight += int64(math.Round(l.other / total / weightQuantum))
	slices.SortFunc(devices, func(a, b entry) int {
		if a.pub.weight != b.pub.weight {
			return cmp.Compare(b.pub.weight, a.pub.weight)
		}
		if a.order != b.order {
			return cmp.Compare(a.order, b.order)
		}
		return compareTypes(&a.t, &b.t)
	})
	var covered int64
	for i, e := range devices {
		covered += e.pub.weight
		if float64(covered) >= learnedCoverage*float64(deviceWeight) || i+1 == maxLearnedTypes {
			devices = devices[:i+1]
			break
		}
	}
	if none != nil {
		devices = append(devices, *none)
	}
	tts := make([]TaskType, len(devices))
	pub := make([]publishedType, len(devices))
	for i, e := range devices {
		tts[i], pub[i] = e.t, e.pub
	}
	return tts, pub
}

// roundHost rounds a mean host request to 7 significant bits (within 1%).
func roundHost(x float64) int64 {
	n := int64(math.Round(x))
	if n <= 0 {
		return 0
	}
	shift := max(0, bits.Len64(uint64(n))-7)
	return (n >> shift) << shift
}

// compareTypes orders task types of equal weight, so that the published
// mix does not depend on the order of a map.
func compareTypes(a, b *TaskType) int {
	if c := cmp.Compare(a.Count, b.Count); c != 0 {
		return c
	}
	if a.Exclusive != b.Exclusive {
		if a.Exclusive {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.Milli, b.Milli); c != 0 {
		return c
	}
	if c := cmp.Compare(a.MemoryMiB, b.MemoryMiB); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Host.CPUMilli, b.Host.CPUMilli); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Selector.Resource, b.Selector.Resource); c != 0 {
		return c
	}
	for _, pair := range [][2][]string{
		{a.Selector.IncludeModels, b.Selector.IncludeModels}, {a.Selector.ExcludeModels, b.Selector.ExcludeModels},
		{a.Selector.IncludeUUIDs, b.Selector.IncludeUUIDs}, {a.Selector.ExcludeUUIDs, b.Selector.ExcludeUUIDs},
	} {
		if c := slices.Compare(pair[0], pair[1]); c != 0 {
			return c
		}
	}
	return 0
}
