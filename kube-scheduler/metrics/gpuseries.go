package metrics

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	k8smetrics "k8s.io/component-base/metrics"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/types"
)

// gpuSeries keeps, between scrapes, the label pairs of every per-GPU series
// and the order to send them in, so that a scrape of a cluster with tens of
// thousands of GPUs neither builds five label sets per GPU nor leaves the
// registry to sort them: the registry sorts each family by its label
// values, which is linear on series sent already in that order. Both are
// rebuilt when a node's devices change (a new inventory), not per scrape.
// Only the collector uses it, under its mutex.
type gpuSeries struct {
	nodes map[string]*nodeSeries
	// byDevice is the order of the dense per-GPU families (labels device,
	// node), as their label pairs; byInfo the order of the info family
	// (device, index, model, node, uuid). Both hold the allocatable GPUs
	// of every node; a node's devicePos says where its GPUs are in
	// byDevice. A scrape reads them front to back.
	byDevice, byInfo [][]*dto.LabelPair
	// stale is set when a node came, went or changed its devices.
	stale bool
}

// nodeSeries is one node's label pairs, per device index.
type nodeSeries struct {
	name    string
	devices *devicescheduler.Node
	gpu     [][]*dto.LabelPair // device, node
	info    [][]*dto.LabelPair // device, index, model, node, uuid
	model   []string           // model label per device
	// devicePos is each allocatable GPU's place in byDevice.
	devicePos []int32
	seen      uint64
}

// gpuValues are one GPU's values in the scrape.
type gpuValues struct {
	cores, memory, memoryCap, pods float64
}

// gpuRef is one GPU of a node.
type gpuRef struct {
	node *nodeSeries
	d    int
}

// update makes nc's node's label pairs current, marks it seen in scrape
// mark and returns them.
func (s *gpuSeries) update(nc *devicecache.NodeView, mark uint64, models *modelLabels) *nodeSeries {
	if s.nodes == nil {
		s.nodes = map[string]*nodeSeries{}
	}
	ns := s.nodes[nc.Name]
	if ns == nil || ns.devices != nc.Devices {
		ns = newNodeSeries(nc.Name, nc.Devices, models)
		s.nodes[nc.Name] = ns
		s.stale = true
	}
	ns.seen = mark
	return ns
}

func newNodeSeries(name string, n *devicescheduler.Node, models *modelLabels) *nodeSeries {
	inv := n.Inventory()
	ns := &nodeSeries{name: name, devices: n,
		gpu: make([][]*dto.LabelPair, len(inv.Devices)), info: make([][]*dto.LabelPair, len(inv.Devices)),
		model: make([]string, len(inv.Devices)), devicePos: make([]int32, len(inv.Devices))}
	// The node's label pairs and their values side by side in memory: a
	// scrape reads them all.
	pairs := make([]dto.LabelPair, 0, 1+4*len(inv.Devices))
	values := make([]string, 0, cap(pairs))
	pair := func(name *string, value string) *dto.LabelPair {
		values = append(values, value)
		pairs = append(pairs, dto.LabelPair{Name: name, Value: &values[len(values)-1]})
		return &pairs[len(pairs)-1]
	}
	nodeLabel := pair(&labelNode, name)
	for d := range inv.Devices {
		dev := &inv.Devices[d]
		device := pair(&labelDevice, dev.ID)
		ns.model[d] = models.label(dev.Model)
		ns.gpu[d] = []*dto.LabelPair{device, nodeLabel}
		ns.info[d] = []*dto.LabelPair{device, pair(&labelIndex, strconv.Itoa(dev.Index)), pair(&labelModel, ns.model[d]), nodeLabel, pair(&labelUUID, dev.UUID)}
	}
	return ns
}

// The label names of the per-GPU series, shared by every label pair.
var labelNode, labelDevice, labelIndex, labelModel, labelUUID = "node", "device", "index", "model", "uuid"

// prune forgets the nodes not seen in scrape mark, and sorts the GPUs
// again if any node came, went or changed.
func (s *gpuSeries) prune(mark uint64) {
	for name, ns := range s.nodes {
		if ns.seen != mark {
			delete(s.nodes, name)
			s.stale = true
		}
	}
	if !s.stale {
		return
	}
	s.stale = false
	var gpus []gpuRef
	for _, ns := range s.nodes {
		alloc := ns.devices.Allocatable()
		for d := range ns.gpu {
			if alloc&(1<<d) != 0 {
				gpus = append(gpus, gpuRef{ns, d})
			}
		}
	}
	slices.SortFunc(gpus, func(a, b gpuRef) int { return compareLabels(a.node.info[a.d], b.node.info[b.d]) })
	s.byInfo = s.byInfo[:0]
	for _, r := range gpus {
		s.byInfo = append(s.byInfo, r.node.info[r.d])
	}
	slices.SortFunc(gpus, func(a, b gpuRef) int { return compareLabels(a.node.gpu[a.d], b.node.gpu[b.d]) })
	s.byDevice = s.byDevice[:0]
	for i, r := range gpus {
		s.byDevice = append(s.byDevice, r.node.gpu[r.d])
		r.node.devicePos[r.d] = int32(i)
	}
}

// compareLabels orders label sets as the registry does: by their values,
// label by label (the names are the same and sorted).
func compareLabels(a, b []*dto.LabelPair) int {
	for i := range a {
		if c := cmp.Compare(a[i].GetValue(), b[i].GetValue()); c != 0 {
			return c
		}
	}
	return 0
}

// gauge is one series of a scrape. The label pairs are shared with the
// cache and with the scrapes before: nothing writes them after they are
// built.
type gauge struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
	dto    dto.Gauge
}

func (g *gauge) Desc() *prometheus.Desc { return g.desc }

func (g *gauge) Write(m *dto.Metric) error {
	g.dto.Value = &g.value
	m.Label, m.Gauge = g.labels, &g.dto
	return nil
}

// promDesc is desc as the registry knows it, or nil if the registry hid it
// (a deprecated metric not shown).
func promDesc(desc *k8smetrics.Desc, labels int) *prometheus.Desc {
	m := k8smetrics.NewLazyConstMetric(desc, k8smetrics.GaugeValue, 0, make([]string, labels)...)
	if m == nil {
		return nil
	}
	return m.Desc()
}

// send sends the per-GPU series of the scrape, each family in the order
// the registry sorts it in, from one allocation of gauges. values are the
// GPUs' in byDevice's order.
func (s *gpuSeries) send(ch chan<- k8smetrics.Metric, values []gpuValues) {
	families := []struct {
		desc  *k8smetrics.Desc
		value func(v *gpuValues) float64
	}{
		{descAllocatedCores, func(v *gpuValues) float64 { return v.cores }},
		{descAllocatedMemory, func(v *gpuValues) float64 { return v.memory }},
		{descMemory, func(v *gpuValues) float64 { return v.memoryCap }},
		{descGPUPods, func(v *gpuValues) float64 { return v.pods }},
	}
	gauges := make([]gauge, (len(families)+1)*len(s.byDevice))
	i := 0
	if desc := promDesc(descInfo, len(infoLabels)); desc != nil {
		for _, labels := range s.byInfo {
			gauges[i] = gauge{desc: desc, labels: labels, value: 1}
			ch <- &gauges[i]
			i++
		}
	}
	for _, f := range families {
		desc := promDesc(f.desc, len(gpuLabels))
		if desc == nil {
			continue
		}
		for j, labels := range s.byDevice {
			gauges[i] = gauge{desc: desc, labels: labels, value: f.value(&values[j])}
			ch <- &gauges[i]
			i++
		}
	}
}

// unhealthy returns a series per GPU that its node publishes as not
// healthy (few: they are sorted here).
func (s *gpuSeries) unhealthy() []gauge {
	var sick []gpuRef
	for _, ns := range s.nodes {
		for d, dev := range ns.devices.Inventory().Devices {
			if dev.Health != types.Healthy {
				sick = append(sick, gpuRef{ns, d})
			}
		}
	}
	if len(sick) == 0 {
		return nil
	}
	desc := promDesc(descUnhealthy, len(infoLabels))
	if desc == nil {
		return nil
	}
	slices.SortFunc(sick, func(a, b gpuRef) int { return compareLabels(a.node.info[a.d], b.node.info[b.d]) })
	gauges := make([]gauge, len(sick))
	for i, r := range sick {
		gauges[i] = gauge{desc: desc, labels: r.node.info[r.d], value: 1}
	}
	return gauges
}
