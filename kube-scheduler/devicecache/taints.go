package devicecache

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// deviceTaints counts the nodes that publish devices by the taints that keep
// pods off them: those of effect NoSchedule or NoExecute, which the
// scheduler's TaintToleration filter checks. With it a scheduling cycle can
// tell, at the cost of the distinct taint sets rather than of the nodes,
// whether a pod could land on any node with devices at all: in clusters
// whose GPU nodes are tainted, a pod without devices that does not tolerate
// the taint needs no score from the plugin.
type deviceTaints struct {
	sets map[string]*taintSet
}

// taintSet is one set of hard taints and how many device nodes carry it.
type taintSet struct {
	taints []corev1.Taint
	nodes  int
}

// hardTaints returns node's NoSchedule and NoExecute taints in a stable
// order, and a key that names them.
func hardTaints(node *corev1.Node) ([]corev1.Taint, string) {
	var out []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			out = append(out, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	slices.SortFunc(out, func(a, b corev1.Taint) int {
		return strings.Compare(string(a.Effect)+"\x00"+a.Key+"\x00"+a.Value, string(b.Effect)+"\x00"+b.Key+"\x00"+b.Value)
	})
	var key strings.Builder
	for _, t := range out {
		key.WriteString(string(t.Effect))
		key.WriteByte(0)
		key.WriteString(t.Key)
		key.WriteByte(0)
		key.WriteString(t.Value)
		key.WriteByte(0)
	}
	return out, key.String()
}

// set counts ns under node's hard taints if it publishes devices, and
// under none otherwise; must hold c.mu for writing.
func (d *deviceTaints) set(ns *nodeState, node *corev1.Node) {
	d.unset(ns)
	if node == nil || !ns.hasInventory {
		return
	}
	taints, key := hardTaints(node)
	if d.sets == nil {
		d.sets = map[string]*taintSet{}
	}
	s, ok := d.sets[key]
	if !ok {
		s = &taintSet{taints: taints}
		d.sets[key] = s
	}
	s.nodes++
	ns.taintKey, ns.taintCounted = key, true
}

// unset stops counting ns; must hold c.mu for writing.
func (d *deviceTaints) unset(ns *nodeState) {
	if !ns.taintCounted {
		return
	}
	if s := d.sets[ns.taintKey]; s != nil {
		if s.nodes--; s.nodes <= 0 {
			delete(d.sets, ns.taintKey)
		}
	}
	ns.taintKey, ns.taintCounted = "", false
}

// DeviceNodesTolerated reports whether some node that publishes devices
// (usable or not) has hard taints that tolerated accepts: false when no
// such node could pass the scheduler's TaintToleration filter for the pod
// whose tolerations tolerated checks, or when the cache knows of no such
// node. tolerated gets each distinct set of NoSchedule and NoExecute
// taints once, and must not keep it.
func (c *Cache) DeviceNodesTolerated(tolerated func(taints []corev1.Taint) bool) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, s := range c.taints.sets {
		if tolerated(s.taints) {
			return true
		}
	}
	return false
}
