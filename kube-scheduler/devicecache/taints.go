package devicecache

import (
	"cmp"
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
//
// What a cycle pays is bounded whatever the nodes say: a node with more
// than maxHardTaints hard taints counts as open to every pod, and with more
// than maxTaintSets distinct sets every pod is taken to reach a device node
// (the plugin then scores pods without devices, as it would without this).
type deviceTaints struct {
	sets map[string]*taintSet
	// open counts the device nodes open to every pod: without hard taints,
	// or with too many to check.
	open int
}

// taintSet is one set of hard taints and how many device nodes carry it.
type taintSet struct {
	taints []corev1.Taint
	nodes  int
}

// Bounds of deviceTaints (see there).
const (
	maxHardTaints = 64
	maxTaintSets  = 256
)

// nodeTaints is what deviceTaints counts a node by: its hard taints in a
// stable order, and a key that names them ("" for none, or too many).
type nodeTaints struct {
	taints []corev1.Taint
	key    string
}

// hardTaints returns node's NoSchedule and NoExecute taints. Called before
// the cache's lock is taken: node objects from informers are not changed.
func hardTaints(node *corev1.Node) nodeTaints {
	var out []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			if len(out) == maxHardTaints {
				return nodeTaints{} // too many to check per cycle: open
			}
			out = append(out, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	slices.SortFunc(out, func(a, b corev1.Taint) int {
		return cmp.Or(strings.Compare(string(a.Effect), string(b.Effect)), strings.Compare(a.Key, b.Key), strings.Compare(a.Value, b.Value))
	})
	var key strings.Builder
	for _, t := range out {
		// Keys and values are qualified names and label values: no NUL.
		key.WriteString(string(t.Effect))
		key.WriteByte(0)
		key.WriteString(t.Key)
		key.WriteByte(0)
		key.WriteString(t.Value)
		key.WriteByte(0)
	}
	return nodeTaints{taints: out, key: key.String()}
}

// set counts ns under t if it publishes devices (usable or not: its score
// differs from a node without devices' either way), and not at all
// otherwise; must hold c.mu for writing.
func (d *deviceTaints) set(ns *nodeState, t nodeTaints) {
	if ns.taintCounted && ns.hasInventory && ns.taintKey == t.key {
		return // unchanged
	}
	d.unset(ns)
	if !ns.hasInventory {
		return
	}
	ns.taintKey, ns.taintCounted = t.key, true
	if t.key == "" {
		d.open++
		return
	}
	if d.sets == nil {
		d.sets = map[string]*taintSet{}
	}
	s, ok := d.sets[t.key]
	if !ok {
		s = &taintSet{taints: t.taints}
		d.sets[t.key] = s
	}
	s.nodes++
}

// unset stops counting ns; must hold c.mu for writing.
func (d *deviceTaints) unset(ns *nodeState) {
	if !ns.taintCounted {
		return
	}
	if ns.taintKey == "" {
		d.open--
	} else if s := d.sets[ns.taintKey]; s != nil {
		if s.nodes--; s.nodes <= 0 {
			delete(d.sets, ns.taintKey)
		}
	}
	ns.taintKey, ns.taintCounted = "", false
}

// KnowsDevices reports whether the cache knows of a node that publishes
// devices (usable or not).
func (c *Cache) KnowsDevices() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.taints.open > 0 || len(c.taints.sets) > 0
}

// DeviceNodesTolerated reports whether some node that publishes devices
// (usable or not) has hard taints that tolerated accepts: false when no
// such node could pass the scheduler's TaintToleration filter for the pod
// whose tolerations tolerated checks, or when the cache knows of no such
// node. tolerated gets each distinct set of NoSchedule and NoExecute
// taints at most once, and must not keep it; beyond maxTaintSets sets
// the answer is true unasked.
func (c *Cache) DeviceNodesTolerated(tolerated func(taints []corev1.Taint) bool) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.taints.open > 0 || len(c.taints.sets) > maxTaintSets {
		return true
	}
	for _, s := range c.taints.sets {
		if tolerated(s.taints) {
			return true
		}
	}
	return false
}
