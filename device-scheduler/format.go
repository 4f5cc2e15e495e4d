package devicescheduler

import (
	"strconv"
	"strings"
)

// Percent formats a compute share in per mille of a device as a
// percentage ("25%", "12.5%"), as users ask for compute in
// kubegpu.io/gpu-cores.
func Percent(milli int) string {
	sign := ""
	if milli < 0 {
		sign, milli = "-", -milli
	}
	s := sign + strconv.Itoa(milli/10)
	if r := milli % 10; r != 0 {
		s += "." + strconv.Itoa(r)
	}
	return s + "%"
}

// percentArg is a compute share formatted by Percent when a refusal's
// details are read.
type percentArg int

func (p percentArg) String() string { return Percent(int(p)) }

// nodeModels formats, when a refusal's details are read, the GPU models
// of a node, each quoted once, in the order of its devices.
type nodeModels struct{ n *Node }

func (m nodeModels) String() string {
	var out []string
	seen := map[string]bool{}
	for _, d := range m.n.inv.Devices {
		if !seen[d.Model] {
			seen[d.Model] = true
			out = append(out, strconv.Quote(d.Model))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// nodeResources formats the device resources a node's devices are served
// as, lazily: only when a not-fit error is printed.
type nodeResources struct{ n *Node }

func (r nodeResources) String() string {
	out := make([]string, len(r.n.served))
	for i, s := range r.n.served {
		out[i] = s.resource
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
