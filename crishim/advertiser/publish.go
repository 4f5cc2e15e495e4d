package advertiser

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// DefaultSlicesPerDevice is how many containers may share one GPU as far as
// kubelet's admission counts nvidia.com/gpu (see Capacity).
const DefaultSlicesPerDevice = 100

// ResourceList is a node's capacity by resource name, as in the Node's
// status (the core API's ResourceList, without linking the core API).
type ResourceList map[string]resource.Quantity

// Capacity is the extended-resource capacity the node publishes for inv.
//
// kubelet admission and the stock NodeResourcesFit plugin count a pod's
// limits against these numbers, while kubegpu's scheduler plugin decides the
// real fit per device. So nvidia.com/gpu counts slices, not GPUs: every
// allocatable device counts slicesPerDevice, so that shared slices (each one
// nvidia.com/gpu) never exhaust the node before its devices are full.
// kubegpu.io/gpu-cores is 100 per device and kubegpu.io/gpu-memory the
// devices' memory in MiB. MIG parents count through their slices only.
func Capacity(inv types.Inventory, slicesPerDevice int) ResourceList {
	var devices, memMiB int64
	parents := map[string]bool{}
	for _, d := range inv.Devices {
		if d.Parent != "" {
			parents[d.Parent] = true
		}
	}
	for _, d := range inv.Devices {
		if parents[d.ID] {
			continue
		}
		devices++
		memMiB += d.MemoryMiB
	}
	return ResourceList{
		kubeinterface.ResourceGPU:       *resource.NewQuantity(devices*int64(slicesPerDevice), resource.DecimalSI),
		kubeinterface.ResourceGPUCores:  *resource.NewQuantity(devices*int64(types.MaxComputePercent), resource.DecimalSI),
		kubeinterface.ResourceGPUMemory: *resource.NewQuantity(memMiB, resource.DecimalSI),
	}
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
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubeinterface.AnnotationInventory: value}}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, patch); err != nil {
		return fmt.Errorf("publish inventory of node %s: %w", node, err)
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
	if err != nil {
		return err
	}
	if err := client.PatchNode(ctx, node, status, "status"); err != nil {
		return fmt.Errorf("publish capacity of node %s: %w", node, err)
	}
	return nil
}

// RenewLease creates or renews the node's heartbeat Lease
// (kube-node-lease/kubegpu-NODE), owned by the Node so that it goes with it.
func RenewLease(ctx context.Context, client Client, node string, duration time.Duration, now time.Time) error {
	_, err := renewLease(ctx, client, node, duration, now)
	return err
}

// renewLease is RenewLease that also says whether the Lease had to be
// created (first start, or the Node and its Lease were re-created).
func renewLease(ctx context.Context, client Client, node string, duration time.Duration, now time.Time) (bool, error) {
	name := kubeinterface.LeaseName(node)
	renew := metav1.NewMicroTime(now)
	lease, err := client.GetLease(ctx, kubeinterface.LeaseNamespace, name)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeinterface.LeaseNamespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(node),
				LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
				AcquireTime:          &renew,
				RenewTime:            &renew,
			},
		}
		if n, err := client.NodeMeta(ctx, node); err == nil {
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
		} else {
			klog.FromContext(ctx).Error(err, "Reading the Node for the heartbeat Lease's owner; creating the Lease without it (it will not be deleted with the Node)")
		}
		if err := client.CreateLease(ctx, lease); err != nil {
			return false, fmt.Errorf("create heartbeat lease of node %s: %w", node, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get heartbeat lease of node %s: %w", node, err)
	}
	lease.Spec.RenewTime = &renew
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(duration / time.Second))
	if err := client.UpdateLease(ctx, lease); err != nil {
		return false, fmt.Errorf("renew heartbeat lease of node %s: %w", node, err)
	}
	return false, nil
}
