package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// markDRA sets DRA on each GPU of rows that another DRA driver's
// ResourceSlice publishes as well (dra.Overlaps, the rule the scheduler
// applies).
func markDRA(s *clusterState, rows []GPU) {
	if len(s.slices) == 0 {
		return // no other driver publishes anything
	}
	at := map[[2]string]int{}
	for i, g := range rows {
		at[[2]string{g.Node, g.ID}] = i
	}
	keys := map[string]map[string]string{}
	for _, n := range s.nodes {
		if n.hasInventory() {
			keys[n.name] = dra.InventoryKeys(n.inv)
		}
	}
	for _, sl := range s.slices {
		for _, o := range dra.Overlaps(sl, keys[*sl.Spec.NodeName]) {
			if i, ok := at[[2]string{*sl.Spec.NodeName, o.Device}]; ok && rows[i].DRA == "" {
				rows[i].DRA = fmt.Sprintf("driver %s, ResourceSlice %s, device %s", o.Driver, o.Slice, o.SliceDevice)
			}
		}
	}
}

// printDRA says what kubegpu leaves to DRA: the GPUs other drivers publish
// as well, and the resources DeviceClasses map, with the kubegpu nodes
// where DRA serves them.
func printDRA(w io.Writer, s *clusterState, rows []GPU) {
	if s.draUnread != "" {
		fmt.Fprintf(w, "\n%s\n", sanitize(s.draUnread))
	}
	var held []GPU
	for _, g := range rows {
		if g.DRA != "" {
			held = append(held, g)
		}
	}
	if len(held) > 0 {
		fmt.Fprintf(w, "\nPublished by other DRA drivers as well: kubegpu-scheduler places no GPU pod on their nodes while they are (%d GPUs):\n", len(held))
		for _, g := range held {
			fmt.Fprintf(w, "  %s GPU %d (%s): %s\n", g.Node, g.Index, sanitize(g.ID), g.DRA)
		}
	}
	for _, m := range dra.Mappings(s.classes, objects.RequestResources) {
		var served []string
		for _, n := range s.nodes {
			if n.hasInventory() && dra.ServedByDRA(n.node, m.Resource) {
				served = append(served, n.name)
			}
		}
		where := "none of kubegpu's nodes"
		if len(served) > 0 {
			where = "kubegpu's nodes " + strings.Join(served, ", ")
		}
		fmt.Fprintf(w, "\nDeviceClass %s maps %s to DRA: pods that ask for it get no GPUs from kubegpu on nodes that advertise none of it (%s).\n", m.Class, m.Resource, where)
	}
}

// draRow is the row of a node where DRA serves the pod (Evaluate's err is
// a *devicecache.DRAServes).
func draRow(node *corev1.Node, err error) (explainRow, bool) {
	var served *devicecache.DRAServes
	if !errors.As(err, &served) {
		return explainRow{}, false
	}
	return explainRow{node: node.Name, dra: true, reason: served.Error() + "; the DynamicResources plugin judges whether the pod fits"}, true
}
