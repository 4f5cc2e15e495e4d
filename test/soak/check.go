package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// use is what the running pods hold of one device.
type use struct {
	exclusive int
	memoryMiB int64
	compute   int
	pods      []string
}

// hostUse is what the running pods request of a node's CPU and memory.
type hostUse struct{ cpuMilli, memory int64 }

// checkAPI checks the API's state once: every bound GPU pod's allocation
// verifies and names devices of its node; no device is held beyond its
// capacity (an exclusive GPU by two pods, slices over its compute or
// memory); no pod waits while a live node has room for it.
func (c *checker) checkAPI(now time.Time) {
	verify := c.verifyKeys()
	invs := map[string]types.Inventory{}
	nodes := map[string]*corev1.Node{}
	for _, o := range c.nodeInf.GetStore().List() {
		n, ok := o.(*corev1.Node)
		if !ok {
			continue
		}
		nodes[n.Name] = n
		if inv, err := objects.NodeInventory(n); err == nil {
			invs[n.Name] = inv
		}
	}
	held := map[string]map[string]*use{}
	host := map[string]*hostUse{}
	var pending []*corev1.Pod
	live := map[string]bool{}
	for _, p := range c.podsNow() {
		if p.Namespace != soakNamespace {
			continue
		}
		live[string(p.UID)] = true
		if p.Spec.NodeName == "" {
			if p.DeletionTimestamp == nil {
				pending = append(pending, p)
			}
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		h := host[p.Spec.NodeName]
		if h == nil {
			h = &hostUse{}
			host[p.Spec.NodeName] = h
		}
		cpu, mem := requests(p)
		h.cpuMilli += cpu
		h.memory += mem
		if !objects.WantsDevices(p) {
			continue
		}
		a, err := objects.HeldAllocation(p, verify)
		if err != nil {
			c.violate("unverified-allocation", podKey(p), "bound to %s: %v", p.Spec.NodeName, err)
			continue
		}
		c.countDevices(p, a.PodAllocation, invs[p.Spec.NodeName], held)
	}
	for node, devs := range held {
		inv := invs[node]
		for id, u := range devs {
			dev := device(inv, id)
			over := u.exclusive > 1 || (u.exclusive == 1 && (u.memoryMiB > 0 || u.compute > 0)) || u.compute > 100 ||
				(dev != nil && u.memoryMiB > dev.MemoryMiB)
			if over {
				sort.Strings(u.pods)
				c.violate("double-allocation", node+"/"+id+"/"+strings.Join(u.pods, ","),
					"held by %s: %d exclusive, %d%% compute, %d MiB", strings.Join(u.pods, ", "), u.exclusive, u.compute, u.memoryMiB)
			}
		}
	}
	c.checkPending(now, pending, nodes, invs, held, host)
	c.mu.Lock()
	c.rounds++
	c.pending = len(pending)
	for uid := range c.created {
		if !live[uid] {
			delete(c.created, uid)
		}
	}
	c.mu.Unlock()
}

// countDevices adds a pod's devices to held: per device, the pod holds it
// whole if a container does, else the sum of its regular containers'
// shares or the largest init container's, whichever is more (init
// containers run one at a time, before the others).
func (c *checker) countDevices(p *corev1.Pod, a types.PodAllocation, inv types.Inventory, held map[string]map[string]*use) {
	type share struct {
		exclusive bool
		mem       int64
		compute   int
	}
	regular, initMax := map[string]share{}, map[string]share{}
	add := func(m map[string]share, d types.DeviceShare, sum bool) {
		s := m[d.ID]
		s.exclusive = s.exclusive || d.Exclusive
		if sum {
			s.mem += d.MemoryMiB
			s.compute += d.ComputePercent
		} else {
			s.mem, s.compute = max(s.mem, d.MemoryMiB), max(s.compute, d.ComputePercent)
		}
		m[d.ID] = s
	}
	for _, ct := range a.Containers {
		for _, d := range ct.Devices {
			add(regular, d, true)
		}
	}
	for _, ct := range a.InitContainers {
		for _, d := range ct.Devices {
			add(initMax, d, false)
		}
	}
	for id, s := range initMax {
		r := regular[id]
		regular[id] = share{exclusive: r.exclusive || s.exclusive, mem: max(r.mem, s.mem), compute: max(r.compute, s.compute)}
	}
	devs := held[a.Node]
	if devs == nil {
		devs = map[string]*use{}
		held[a.Node] = devs
	}
	for id, s := range regular {
		if device(inv, id) == nil {
			c.violate("unknown-device", podKey(p), "its allocation names device %s, not in node %s's inventory", id, a.Node)
		}
		u := devs[id]
		if u == nil {
			u = &use{}
			devs[id] = u
		}
		if s.exclusive {
			u.exclusive++
		} else {
			u.memoryMiB += s.mem
			u.compute += s.compute
		}
		u.pods = append(u.pods, p.Name)
	}
}

// checkPending judges the pods waiting for a node: one that has had room
// on a live node for stuckAfter, with no fault under way or recent, is
// stuck. Room is the checker's own conservative notion: whole idle GPUs
// of an accepted model for every GPU it asks (slices included), and the
// host's CPU and memory. Gang members are left out (their room is the
// group's).
func (c *checker) checkPending(now time.Time, pending []*corev1.Pod, nodes map[string]*corev1.Node, invs map[string]types.Inventory,
	held map[string]map[string]*use, host map[string]*hostUse) {
	calm := c.calm(now)
	waiting := map[string]bool{}
	for _, p := range pending {
		uid := string(p.UID)
		waiting[uid] = true
		if p.Spec.SchedulingGroup != nil {
			continue
		}
		room := ""
		for name, n := range nodes {
			if c.hasRoom(p, n, invs[name], held[name], host[name], now) {
				room = name
				break
			}
		}
		c.mu.Lock()
		since, ok := c.fitting[uid]
		switch {
		case room == "" || !calm:
			delete(c.fitting, uid)
		case !ok:
			c.fitting[uid] = now
		case now.Sub(since) > stuckAfter:
			c.mu.Unlock()
			c.violate("stuck-pending", podKey(p), "pending for %s while node %s had room and no fault was under way",
				now.Sub(since).Round(time.Second), room)
			c.mu.Lock()
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	for uid := range c.fitting {
		if !waiting[uid] {
			delete(c.fitting, uid)
		}
	}
	c.mu.Unlock()
}

// hasRoom reports whether node n could take pod p now, by the checker's
// conservative rule.
func (c *checker) hasRoom(p *corev1.Pod, n *corev1.Node, inv types.Inventory, devs map[string]*use, h *hostUse, now time.Time) bool {
	if n.Spec.Unschedulable || !ready(n) || !c.live(n.Name, now) {
		return false
	}
	for k, v := range p.Spec.NodeSelector {
		if n.Labels[k] != v {
			return false
		}
	}
	for _, t := range n.Spec.Taints {
		if (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && !tolerates(p, t) {
			return false
		}
	}
	cpu, mem := requests(p)
	if h == nil {
		h = &hostUse{}
	}
	if cpu > n.Status.Allocatable.Cpu().MilliValue()-h.cpuMilli || mem > n.Status.Allocatable.Memory().Value()-h.memory {
		return false
	}
	want := 0
	for _, ct := range p.Spec.Containers {
		q := ct.Resources.Limits[kubeinterface.ResourceGPU]
		want += int(q.Value())
	}
	if want == 0 {
		return true
	}
	var models []string
	if v := p.Annotations[kubeinterface.AnnotationModelInclude]; v != "" {
		models = strings.Split(v, ",")
	}
	idle := 0
	for _, d := range inv.Devices {
		if devs[d.ID] != nil || (d.Health != "" && d.Health != types.Healthy) {
			continue
		}
		if len(models) > 0 && !slices.Contains(models, d.Model) {
			continue
		}
		idle++
	}
	return idle >= want
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func tolerates(p *corev1.Pod, t corev1.Taint) bool {
	for _, tol := range p.Spec.Tolerations {
		if tol.Key == t.Key && (tol.Operator == corev1.TolerationOpExists || tol.Value == t.Value) &&
			(tol.Effect == "" || tol.Effect == t.Effect) {
			return true
		}
	}
	return false
}

// requests are a pod's CPU (millicores) and memory (bytes) requests, its
// regular containers' sum or its largest init container's.
func requests(p *corev1.Pod) (cpu, mem int64) {
	for _, ct := range p.Spec.Containers {
		cpu += ct.Resources.Requests.Cpu().MilliValue()
		mem += ct.Resources.Requests.Memory().Value()
	}
	for _, ct := range p.Spec.InitContainers {
		cpu = max(cpu, ct.Resources.Requests.Cpu().MilliValue())
		mem = max(mem, ct.Resources.Requests.Memory().Value())
	}
	return cpu, mem
}

func device(inv types.Inventory, id string) *types.Device {
	for i := range inv.Devices {
		if inv.Devices[i].ID == id {
			return &inv.Devices[i]
		}
	}
	return nil
}

func podKey(p *corev1.Pod) string { return fmt.Sprintf("%s/%s", p.Name, p.UID) }
