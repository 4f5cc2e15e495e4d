package draclaims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// ErrUnknown is wrapped when the Guard cannot tell what DRA claims hold:
// kubelet's PodResources API does not answer while another driver
// publishes the node's GPUs, or the node's ResourceSlices are not read
// yet while kubelet reports claims of other drivers.
var ErrUnknown = errors.New("cannot tell which GPUs DRA claims hold")

// PodResources is what the Guard asks kubelet (its PodResources API).
type PodResources interface {
	List(ctx context.Context) ([]*podresourcesapi.PodResources, error)
}

// device is a device of another driver's slice: driver, pool, name.
type device struct{ driver, pool, name string }

// Guard is safe for concurrent use.
type Guard struct {
	node string
	pr   PodResources

	mu sync.RWMutex
	// slices holds, per name, the devices of another driver's slice that
	// have identifiers (dra.DeviceKeys).
	slices map[string]sliceDevices
	keys   map[string]string // dra.InventoryKeys of the node's devices
	// family maps a GPU to its partitions (MIG) and a partition to its
	// GPU: a claim on either holds both.
	family map[string][]string
	synced bool
	// What the slices and the inventory give, made again on each change
	// of either (matchLocked), never changed in place: the overlaps,
	// sorted, and the kubegpu devices each overlapping device of another
	// driver holds.
	overlaps []dra.Overlap
	byDevice map[device][]string
}

type sliceDevices struct {
	driver, pool string
	names        []string
	keys         [][]string
}

// New returns a Guard for node that asks pr (nil: kubelet's PodResources
// API is not available) what claims hold. Run feeds it the node's
// ResourceSlices, SetInventory the node's devices.
func New(node string, pr PodResources) *Guard {
	return &Guard{node: node, pr: pr, slices: map[string]sliceDevices{}}
}

// SetInventory sets the node's kubegpu devices.
func (g *Guard) SetInventory(inv types.Inventory) {
	keys := dra.InventoryKeys(inv)
	family := map[string][]string{}
	for _, d := range inv.Devices {
		if d.Parent != "" {
			family[d.Parent] = append(family[d.Parent], d.ID)
			family[d.ID] = append(family[d.ID], d.Parent)
		}
	}
	g.mu.Lock()
	g.keys, g.family = keys, family
	g.matchLocked()
	g.mu.Unlock()
}

// matchLocked matches the slices against the inventory; must hold g.mu.
func (g *Guard) matchLocked() {
	var overlaps []dra.Overlap
	byDevice := map[device][]string{}
	for name, sd := range g.slices {
		devices, at := dra.MatchKeys(sd.keys, g.keys)
		for i, id := range devices {
			overlaps = append(overlaps, dra.Overlap{Device: id, Driver: sd.driver, Slice: name, SliceDevice: sd.names[at[i]]})
			byDevice[device{sd.driver, sd.pool, sd.names[at[i]]}] = append([]string{id}, g.family[id]...)
		}
	}
	sort.Slice(overlaps, func(i, j int) bool {
		a, b := overlaps[i], overlaps[j]
		return a.Device < b.Device || a.Device == b.Device && (a.Driver < b.Driver || a.Driver == b.Driver && a.Slice < b.Slice)
	})
	g.overlaps, g.byDevice = overlaps, byDevice
}

// Run watches the node's ResourceSlices of other drivers until ctx ends.
// client carries the node's credentials.
func (g *Guard) Run(ctx context.Context, client kubernetes.Interface) {
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, g.node).String()
	}))
	inf := factory.Resource().V1().ResourceSlices().Informer()
	update := func(obj any) {
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			g.update(s)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				g.mu.Lock()
				delete(g.slices, s.Name)
				g.matchLocked()
				g.mu.Unlock()
			}
		},
	}); err != nil {
		logger.Error(err, "Cannot watch the node's ResourceSlices: GPUs that other DRA drivers publish are not checked")
		return
	}
	factory.Start(ctx.Done())
	if toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		g.mu.Lock()
		g.synced = true
		g.mu.Unlock()
		logger.V(2).Info("Read the node's ResourceSlices of other DRA drivers")
	}
	<-ctx.Done()
	factory.Shutdown()
}

func (g *Guard) update(s *resourceapi.ResourceSlice) {
	sd := sliceDevices{driver: s.Spec.Driver, pool: s.Spec.Pool.Name}
	if s.Spec.Driver != dra.DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == g.node {
		for i := range s.Spec.Devices {
			if k := dra.DeviceKeys(&s.Spec.Devices[i]); len(k) > 0 {
				sd.names, sd.keys = append(sd.names, s.Spec.Devices[i].Name), append(sd.keys, k)
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(sd.names) == 0 {
		delete(g.slices, s.Name)
	} else {
		g.slices[s.Name] = sd
	}
	g.matchLocked()
}

// Overlaps lists the node's kubegpu devices that other drivers publish,
// sorted, and whether the node's slices have been read.
func (g *Guard) Overlaps() ([]dra.Overlap, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.overlaps, g.synced
}

// resolver maps the devices of other drivers' slices to the kubegpu
// devices they hold: the device itself, and its GPU or partitions;
// active is false when no other driver publishes a kubegpu device and the
// slices have been read: nothing to check.
func (g *Guard) resolver() (byDevice map[device][]string, active, synced bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.byDevice, len(g.byDevice) > 0 || !g.synced, g.synced
}

// Holder is a prepared ResourceClaim that holds a kubegpu device.
type Holder struct {
	// Pod is the claim's pod as kubelet reports it (namespace/name), Claim
	// the claim (namespace/name), Driver and Device the claim's device.
	Pod, Claim, Driver, Device string
}

func (h Holder) String() string {
	return fmt.Sprintf("ResourceClaim %s of pod %s (DRA driver %s, device %s)", h.Claim, h.Pod, h.Driver, h.Device)
}

// Claims is what the prepared DRA claims on the node hold, for one pod's
// container about to be created.
type Claims struct {
	// Others maps the kubegpu devices that claims of other pods hold to
	// a holder.
	Others map[string]Holder
	// Own are the kubegpu devices this pod's claims hold, sorted, and
	// CDI the CDI devices kubelet passes for all of this pod's claims
	// (the container keeps them).
	Own []string
	CDI []string
}

// listTimeout bounds a PodResources call: kubelet answers from memory.
const listTimeout = 5 * time.Second

// For returns what the prepared claims hold, for a container of pod
// (namespace, name). It asks kubelet only while another driver publishes
// a kubegpu device of the node, or the node's slices are not read yet;
// otherwise it returns nothing at once. Before the slices are read, a
// claim of another driver whose CDI devices are GPUs'
// (rewrite.IsGPUCDIDevice) cannot be resolved and is an error; other
// claims (a NIC's) are not. An error wraps ErrUnknown.
func (g *Guard) For(ctx context.Context, namespace, name string) (Claims, error) {
	var out Claims
	byDevice, active, synced := g.resolver()
	if !active {
		return out, nil
	}
	if g.pr == nil {
		if !synced {
			return out, nil // nothing to ask, and nothing known to conflict
		}
		return out, fmt.Errorf("%w: another DRA driver publishes this node's GPUs and kubelet's PodResources API is not configured (--pod-resources-endpoint)", ErrUnknown)
	}
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	pods, err := g.pr.List(lctx)
	if err != nil {
		if !synced {
			// The slices are not read yet, so no conflict is known:
			// kubelet not answering must not stop every GPU container.
			klog.FromContext(ctx).V(2).Info("Kubelet's PodResources API does not answer; the node's ResourceSlices are not read yet either", "err", err)
			return out, nil
		}
		return out, fmt.Errorf("%w: kubelet's PodResources API: %w", ErrUnknown, err)
	}
	for _, p := range pods {
		own := p.GetNamespace() == namespace && p.GetName() == name
		for _, c := range p.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if own {
						for _, cdi := range cr.GetCdiDevices() {
							out.CDI = append(out.CDI, cdi.GetName())
						}
					}
					if cr.GetDriverName() == dra.DriverName {
						continue
					}
					ids, ok := byDevice[device{cr.GetDriverName(), cr.GetPoolName(), cr.GetDeviceName()}]
					if !ok {
						if !synced && slices.ContainsFunc(cr.GetCdiDevices(), func(d *podresourcesapi.CDIDevice) bool { return rewrite.IsGPUCDIDevice(d.GetName()) }) {
							return Claims{}, fmt.Errorf("%w: pod %s/%s holds GPU %s of DRA driver %s and the node's ResourceSlices are not read yet",
								ErrUnknown, p.GetNamespace(), p.GetName(), cr.GetDeviceName(), cr.GetDriverName())
						}
						continue // not a kubegpu device
					}
					if own {
						out.Own = append(out.Own, ids...)
						continue
					}
					if out.Others == nil {
						out.Others = map[string]Holder{}
					}
					for _, id := range ids {
						if _, seen := out.Others[id]; !seen {
							out.Others[id] = Holder{Pod: p.GetNamespace() + "/" + p.GetName(), Claim: dr.GetClaimNamespace() + "/" + dr.GetClaimName(),
								Driver: cr.GetDriverName(), Device: cr.GetDeviceName()}
						}
					}
				}
			}
		}
	}
	slices.Sort(out.Own)
	out.Own = slices.Compact(out.Own)
	slices.Sort(out.CDI)
	out.CDI = slices.Compact(out.CDI)
	return out, nil
}
