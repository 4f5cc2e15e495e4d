package devicecache

import (
	"encoding/binary"
	"hash/maphash"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// ShapeKey identifies a request's shape in the Filter memo: 128 bits of
// hash, whatever the size of the request. The hash is seeded per process,
// so that no pod can be made to collide with another's shape on purpose.
type ShapeKey [2]uint64

var shapeSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// RequestShape hashes everything the request's fit and score depend on
// (container names included: they appear in the reasons a pod does not
// fit). Its cost is linear in the request's size, which PodRequest bounds.
func RequestShape(req types.PodRequest, host devicescheduler.Host, enforcement types.EnforcementPolicy) ShapeKey {
	var out ShapeKey
	for i := range out {
		var h maphash.Hash
		h.SetSeed(shapeSeeds[i])
		var b [8]byte
		num := func(n int64) {
			binary.LittleEndian.PutUint64(b[:], uint64(n))
			h.Write(b[:])
		}
		str := func(s string) {
			num(int64(len(s)))
			h.WriteString(s)
		}
		num(host.CPUMilli)
		num(host.MemoryMiB)
		str(string(req.Placement))
		str(string(enforcement))
		for _, list := range [][]types.ContainerRequest{req.InitContainers, req.Containers} {
			num(int64(len(list)))
			for _, c := range list {
				str(c.Name)
				num(int64(c.Count))
				num(c.MemoryMiB)
				num(int64(c.ComputePercent))
				str(string(c.Topology))
				str(c.Selector.Resource)
				for _, l := range [][]string{c.Selector.IncludeModels, c.Selector.ExcludeModels, c.Selector.IncludeUUIDs, c.Selector.ExcludeUUIDs} {
					num(int64(len(l)))
					for _, s := range l {
						str(s)
					}
				}
			}
		}
		out[i] = h.Sum64()
	}
	return out
}
