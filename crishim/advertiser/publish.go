package advertiser

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// DefaultSlicesPerDevice is how many containers may share one GPU as far as
// kubelet's admission counts nvidia.com/gpu (see Capacity).
const DefaultSlicesPerDevice = 100

// ResourceList is a node's capacity by resource name, as in the Node's
// status (the core API's ResourceList, without linking the core API).
type ResourceList map[string]resource.Quantity

// resourceNames are the extended resources the advertiser may publish:
// the device resources, GPU Aware Scheduling's, and kubegpu's own.
var resourceNames = append(append(types.DeviceResources(), gasNames...), ownNames...)

// gasNames are GPU Aware Scheduling's resources, published where the node
// has Intel GPUs, so that kubelet admits pods that ask for them: the
// millicores of all (1000 a GPU) and their memory in bytes. The scheduler
// places each GPU's part of a pod's total rounded up, so these totals
// never refuse what it places.
var gasNames = []string{kubeinterface.ResourceIntelMillicores, kubeinterface.ResourceIntelMemoryMax}

// intel reports whether a device resource is Intel's, which GAS's
// resources go with.
func intel(resource string) bool {
	return resource == types.ResourceIntelI915 || resource == types.ResourceIntelXe
}

// ownNames are the extended resources the advertiser always manages:
// kubegpu's own and nvidia.com/gpu, which it published before it served
// other vendors.
var ownNames = []string{types.ResourceNVIDIAGPU,
	kubeinterface.ResourceGPUCores, kubeinterface.ResourceGPUMemory, kubeinterface.ResourceGPUShare, kubeinterface.ResourceGPUs}

// Owned lists the extended resources the node's advertiser manages: its
// own, those of capacity, and the device resources of the inventory it
// published last (inventory, the node's annotation; empty or unreadable:
// none). Another vendor's resource it never published (amd.com/gpu of
// AMD's device plugin on a node whose shim serves no AMD GPU) is not its
// to write or remove.
func Owned(capacity ResourceList, inventory string) []string {
	out := slices.Clone(ownNames)
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for name := range capacity {
		add(name)
	}
	if inventory != "" {
		if inv, err := kubeinterface.DecodeInventory(inventory); err == nil {
			for _, d := range inv.Devices {
				if slices.Contains(resourceNames, d.ServedAs()) {
					add(d.ServedAs())
				}
				if intel(d.ServedAs()) {
					for _, name := range gasNames {
						add(name)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// EqualOn reports whether l and o hold the same quantities of names.
func (l ResourceList) EqualOn(o ResourceList, names []string) bool {
	for _, name := range names {
		q, ok := l[name]
		p, ok2 := o[name]
		if ok != ok2 || (ok && q.Cmp(p) != 0) {
			return false
		}
	}
	return true
}

// Capacity is the extended-resource capacity the node publishes for inv.
//
// kubelet admission and the stock NodeResourcesFit plugin count a pod's
// limits against these numbers, while kubegpu's scheduler plugin decides the
// real fit per device. So nvidia.com/gpu counts slices, not GPUs: every
// allocatable device counts slicesPerDevice, so that shared slices (each one
// nvidia.com/gpu) never exhaust the node before its devices are full. Each
// device counts so under the device resource it is served as
// (Device.ServedAs): amd.com/gpu for AMD's GPUs. nvidia.com/gpu is always
// published (0 on a node without NVIDIA GPUs, as before other vendors
// were served); another device resource only while the node has devices
// of it.
// kubegpu.io/gpu-cores is 100 per device and kubegpu.io/gpu-memory the
// devices' memory in MiB. kubegpu.io/gpu-share, what the pods' GPUs are
// worth for quota (see kubeinterface.ResourceGPUShare), is 100 per device
// times slicesPerDevice, inflated as nvidia.com/gpu is: it exists for
// ResourceQuota, and neither kubelet nor NodeResourcesFit must refuse on
// it what kubegpu's plugin places (or before the plugin says why a pod does
// not fit). MIG parents count through their slices only. kubegpu.io/gpus
// is the physical GPUs, MIG mode or not: what tools that read capacity
// should count.
func Capacity(inv types.Inventory, slicesPerDevice int) ResourceList {
	var devices, memMiB, physical, intelGPUs, intelMemMiB int64
	perResource := map[string]int64{types.ResourceNVIDIAGPU: 0}
	parents := map[string]bool{}
	for _, d := range inv.Devices {
		if d.Parent != "" {
			parents[d.Parent] = true
		}
	}
	for _, d := range inv.Devices {
		if d.Parent == "" {
			physical++
		}
		if parents[d.ID] {
			continue
		}
		devices++
		perResource[d.ServedAs()]++
		memMiB += d.MemoryMiB
		if intel(d.ServedAs()) {
			intelGPUs++
			intelMemMiB += d.MemoryMiB
		}
	}
	out := ResourceList{
		kubeinterface.ResourceGPUCores:  *resource.NewQuantity(devices*int64(types.MaxComputePercent), resource.DecimalSI),
		kubeinterface.ResourceGPUMemory: *resource.NewQuantity(memMiB, resource.DecimalSI),
		kubeinterface.ResourceGPUShare:  *resource.NewQuantity(devices*int64(types.MaxComputePercent)*int64(slicesPerDevice), resource.DecimalSI),
		kubeinterface.ResourceGPUs:      *resource.NewQuantity(physical, resource.DecimalSI),
	}
	for name, n := range perResource {
		out[name] = *resource.NewQuantity(n*int64(slicesPerDevice), resource.DecimalSI)
	}
	if intelGPUs > 0 {
		out[kubeinterface.ResourceIntelMillicores] = *resource.NewQuantity(1000*intelGPUs, resource.DecimalSI)
		out[kubeinterface.ResourceIntelMemoryMax] = *resource.NewQuantity(intelMemMiB<<20, resource.BinarySI)
	}
	return out
}

// PublishInventory writes the node's inventory annotation (a merge patch of
// the node) and its extended-resource capacity and allocatable (a patch of
// the node's status subresource: status written through the node itself is
// dropped).
func PublishInventory(ctx context.Context, client Client, node string, inv types.Inventory, capacity ResourceList) error {
	value, err := kubeinterface.EncodeInventory(inv)
	if err != nil {
		return err
	}
	if err := patchInventory(ctx, client, node, value); err != nil {
		return err
	}
	return patchCapacity(ctx, client, node, capacity, Owned(capacity, value))
}

func patchInventory(ctx context.Context, client Client, node, value string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubeinterface.AnnotationInventory: value}}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, ktypes.MergePatchType, patch); err != nil {
		return fmt.Errorf("publish inventory of node %s: %w", node, err)
	}
	return nil
}

func patchCapacity(ctx context.Context, client Client, node string, capacity ResourceList, owned []string) error {
	// What the node no longer has (a module's devices gone) is removed.
	list := map[string]any{}
	for _, name := range owned {
		if q, ok := capacity[name]; ok {
			list[name] = q
		} else {
			list[name] = nil
		}
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": list, "allocatable": list}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, ktypes.MergePatchType, status, "status"); err != nil {
		return fmt.Errorf("publish capacity of node %s: %w", node, err)
	}
	return nil
}

// Withdraw removes from the node what the advertiser publishes on it: the
// inventory annotation, the extended resources (capacity and allocatable)
// and the conditions ConditionDevicesReady and ConditionDRAConflict, so
// that a node whose shim is uninstalled advertises no GPUs kubegpu served
// (a node moved to a DRA driver must advertise no nvidia.com/gpu for DRA
// to serve it). Kubelet leaves extended resources it does not serve as
// they are, so nothing else would. The node's own credentials may.
func Withdraw(ctx context.Context, client Client, node string) error {
	n, err := client.GetNode(ctx, node)
	if err != nil {
		return fmt.Errorf("read node %s: %w", node, err)
	}
	owned := Owned(nil, n.Inventory)
	annotations, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{kubeinterface.AnnotationInventory: nil}}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, ktypes.MergePatchType, annotations); err != nil {
		return fmt.Errorf("remove the inventory of node %s: %w", node, err)
	}
	gone := map[string]any{}
	for _, name := range owned {
		gone[name] = nil
	}
	var conditions []map[string]string
	for _, typ := range []string{kubeinterface.ConditionDevicesReady, kubeinterface.ConditionDRAConflict} {
		conditions = append(conditions, map[string]string{"type": typ, "$patch": "delete"})
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": gone, "allocatable": gone, "conditions": conditions}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, ktypes.StrategicMergePatchType, status, "status"); err != nil {
		return fmt.Errorf("remove the GPU capacity and conditions of node %s: %w", node, err)
	}
	return nil
}

// maxConditionMessage bounds the condition's message: the full errors are
// in the shim's log and on its /healthz.
const maxConditionMessage = 2048

// boundMessage cuts a message to maxConditionMessage bytes.
func boundMessage(msg string) string {
	if len(msg) <= maxConditionMessage {
		return msg
	}
	return strings.ToValidUTF8(msg[:maxConditionMessage-len("…")], "") + "…"
}

// patchCondition writes the node's condition of type typ with a strategic
// merge patch of its status, which merges conditions by type and so leaves
// kubelet's own alone (a JSON merge patch would replace the whole list).
// transition says whether its status changed, which moves
// lastTransitionTime.
func patchCondition(ctx context.Context, client Client, node, typ string, c Condition, now time.Time, transition bool) error {
	ts := now.UTC().Format(time.RFC3339)
	cond := map[string]string{"type": typ, "status": c.Status, "reason": c.Reason,
		"message": c.Message, "lastHeartbeatTime": ts}
	if transition {
		cond["lastTransitionTime"] = ts
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]string{cond}}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, ktypes.StrategicMergePatchType, patch, "status"); err != nil {
		return fmt.Errorf("write condition %s of node %s: %w", typ, node, err)
	}
	return nil
}
