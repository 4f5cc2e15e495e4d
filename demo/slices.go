package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// showSlices prints node's ResourceSlices of kubegpu's driver, one line per
// device, once the shim has published them.
func showSlices(ctx context.Context, client kubernetes.Interface, node string) error {
	var slices []resourceapi.ResourceSlice
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: dra.NodeSelector(node)})
		if err != nil {
			return false, nil
		}
		slices = list.Items
		return len(slices) > 0, nil
	}); err != nil {
		return fmt.Errorf("no ResourceSlices of %s for %s: %w", dra.DriverName, node, err)
	}
	attr := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		a, ok := d.Attributes[name]
		switch {
		case !ok:
			return "-"
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return fmt.Sprint(*a.IntValue)
		case a.VersionValue != nil:
			return *a.VersionValue
		}
		return "?"
	}
	fmt.Printf("    %-6s %-22s %-10s %-8s %-9s %-7s %s\n", "DEVICE", "MODEL", "UUID", "MEMORY", "LINKGROUP", "NUMA", "TAINTS")
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			var taints []string
			for _, t := range d.Taints {
				taints = append(taints, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
			}
			mem := d.Capacity[dra.CapacityMemory].Value
			uuid := attr(d, dra.AttributeUUID)
			if len(uuid) > 10 {
				uuid = uuid[:9] + "…"
			}
			fmt.Printf("    %-6s %-22s %-10s %-8s %-9s %-7s %s\n", d.Name, attr(d, dra.AttributeModel), uuid, mem.String(),
				attr(d, dra.AttributeLinkGroup), attr(d, dra.AttributeNUMANode), strings.Join(taints, ","))
		}
	}
	fmt.Printf("    (kubectl get resourceslices --field-selector spec.nodeName=%s -o yaml: %d slice(s) of driver %s)\n", node, len(slices), dra.DriverName)
	return nil
}

// createClaim creates the ResourceClaim in doc as the tenant.
func createClaim(ctx context.Context, tenant *localcluster.Identity, doc string) error {
	var claim resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict([]byte(doc), &claim); err != nil {
		return err
	}
	if _, err := tenant.Client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Create(ctx, &claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceClaim %s: %w", claim.Name, err)
	}
	fmt.Printf("    resourceclaim/%s created\n", claim.Name)
	return nil
}
