package nvidia

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/types"
)

// noticeNoP2P keys the one log of GPUs on an NVSwitch fabric without
// NVLink peer-to-peer.
const noticeNoP2P = "no NVSwitch peer-to-peer"

// nvlinkScan is what a GPU's NVLinks reach.
type nvlinkScan struct {
	// toGPU counts the active links to each GPU, by PCI bus ID.
	toGPU map[string]int
	// toFabric counts the active links to NVSwitches (or, where the driver
	// cannot tell the far end's type, to anything that is not a GPU).
	toFabric int
}

// linksBetween returns the link between every pair of answering GPUs,
// measuring the pairs not measured before.
func (n *node) linksBetween(ctx context.Context, gpus []gpuRecord) ([]types.Link, error) {
	busIDs := make(map[string]bool, len(gpus))
	for _, g := range gpus {
		busIDs[g.dev.PCIBusID] = true
	}
	scans := map[int]nvlinkScan{}
	scan := func(g gpuRecord) (nvlinkScan, error) {
		if s, ok := scans[g.dev.Index]; ok {
			return s, nil
		}
		s, err := scanNVLinks(g.handle, busIDs)
		if err != nil {
			return nvlinkScan{}, fmt.Errorf("GPU %d: %w", g.dev.Index, err)
		}
		scans[g.dev.Index] = s
		return s, nil
	}
	var (
		links []types.Link
		noP2P []string
	)
	for i, a := range gpus {
		for _, b := range gpus[i+1:] {
			key := [2]string{a.dev.UUID, b.dev.UUID}
			if key[0] > key[1] {
				key[0], key[1] = key[1], key[0]
			}
			l, ok := n.links[key]
			if !ok {
				if a.lost || b.lost {
					continue // treated as the worst path; the lost GPU is unhealthy anyway
				}
				sa, err := scan(a)
				if err != nil {
					return nil, fmt.Errorf("discover links: %w", err)
				}
				sb, err := scan(b)
				if err != nil {
					return nil, fmt.Errorf("discover links: %w", err)
				}
				var stable bool
				if l, stable, err = measureLink(ctx, a, b, sa, sb); err != nil {
					return nil, fmt.Errorf("discover links: GPUs %d and %d: %w", a.dev.Index, b.dev.Index, err)
				}
				if stable {
					n.links[key] = l
				} else {
					noP2P = append(noP2P, a.dev.ID+"-"+b.dev.ID)
				}
			}
			l.A, l.B = a.dev.ID, b.dev.ID
			links = append(links, l)
		}
	}
	if len(noP2P) > 0 && !n.noticed[noticeNoP2P] {
		// Measured again at every discovery until peer-to-peer works.
		klog.FromContext(ctx).Info("GPUs reach an NVSwitch fabric but NVLink peer-to-peer between them is unavailable (is nvidia-fabricmanager running?); rating their PCIe paths until it is",
			"pairs", noP2P)
		n.noticed[noticeNoP2P] = true
	}
	return links, nil
}

// scanNVLinks follows every active NVLink of a GPU to its far end. gpus are
// the bus IDs of the node's GPUs.
func scanNVLinks(h nvml.Device, gpus map[string]bool) (nvlinkScan, error) {
	s := nvlinkScan{toGPU: map[string]int{}}
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := h.GetNvLinkState(l)
		switch {
		// No NVLink on this GPU, or not this many links.
		case unsupported(ret) || ret == nvml.ERROR_INVALID_ARGUMENT:
			continue
		case ret != nvml.SUCCESS:
			return nvlinkScan{}, nvmlError(fmt.Sprintf("get state of NVLink %d", l), ret)
		case state != nvml.FEATURE_ENABLED:
			continue
		}
		kind, ret := h.GetNvLinkRemoteDeviceType(l)
		switch {
		case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
			s.toFabric++
			continue
		case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_IBMNPU:
			continue // a link to the CPU
		case ret != nvml.SUCCESS && !unsupported(ret):
			return nvlinkScan{}, nvmlError(fmt.Sprintf("get far end of NVLink %d", l), ret)
		}
		pci, ret := h.GetNvLinkRemotePciInfo(l)
		switch {
		case unsupported(ret):
			continue
		case ret != nvml.SUCCESS:
			return nvlinkScan{}, nvmlError(fmt.Sprintf("get PCI info of the far end of NVLink %d", l), ret)
		}
		bus, err := normalizeBusID(cString(pci.BusId[:]))
		if err != nil {
			return nvlinkScan{}, fmt.Errorf("far end of NVLink %d: %w", l, err)
		}
		if gpus[bus] {
			s.toGPU[bus]++
		} else {
			s.toFabric++
		}
	}
	return s, nil
}

// measureLink classifies the path between GPUs a and b: direct NVLinks
// (counted), an NVSwitch fabric both reach with working NVLink
// peer-to-peer, else the PCIe path through their common ancestor. stable is
// false when both reach an NVSwitch fabric without NVLink peer-to-peer
// (it waits for the fabric manager), an answer that may change while the
// node runs.
func measureLink(ctx context.Context, a, b gpuRecord, sa, sb nvlinkScan) (l types.Link, stable bool, err error) {
	logger := klog.FromContext(ctx)
	if count := max(sa.toGPU[b.dev.PCIBusID], sb.toGPU[a.dev.PCIBusID]); count > 0 {
		return types.Link{Kind: types.LinkNVLink, Count: count}, true, nil
	}
	stable = true
	if sa.toFabric > 0 && sb.toFabric > 0 {
		status, ret := a.handle.GetP2PStatus(b.handle, nvml.P2P_CAPS_INDEX_NVLINK)
		switch {
		case ret == nvml.SUCCESS && status == nvml.P2P_STATUS_OK:
			return types.Link{Kind: types.LinkNVSwitch}, true, nil
		case ret == nvml.SUCCESS:
			stable = false
		case unsupported(ret):
			logger.V(2).Info("Driver cannot report NVLink peer-to-peer status; GPUs on one NVSwitch fabric taken as connected",
				"gpuA", a.dev.ID, "gpuB", b.dev.ID)
			return types.Link{Kind: types.LinkNVSwitch}, true, nil
		default:
			return types.Link{}, false, nvmlError("get NVLink peer-to-peer status", ret)
		}
	}
	level, ret := a.handle.GetTopologyCommonAncestor(b.handle)
	if err := nvmlError("get PCIe common ancestor", ret); err != nil {
		return types.Link{}, false, err
	}
	switch level {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE, nvml.TOPOLOGY_MULTIPLE:
		return types.Link{Kind: types.LinkPCIeSwitch}, stable, nil
	case nvml.TOPOLOGY_HOSTBRIDGE, nvml.TOPOLOGY_NODE:
		return types.Link{Kind: types.LinkHostBridge}, stable, nil
	case nvml.TOPOLOGY_SYSTEM:
		return types.Link{Kind: types.LinkCrossSocket}, stable, nil
	default:
		logger.Info("Unknown PCIe topology level; rating the path as crossing CPU sockets", "gpuA", a.dev.ID, "gpuB", b.dev.ID, "level", int(level))
		return types.Link{Kind: types.LinkCrossSocket}, stable, nil
	}
}
