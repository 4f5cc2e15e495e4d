package app

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/cli/ui"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// syncTimeout bounds the wait for the first lists of the watches.
const syncTimeout = 2 * time.Minute

// watcher keeps what the page shows from watches: the objects listFromAPI
// lists, and the ResourceQuotas. Optional kinds the caller may not list
// are not watched, and said so (draUnread).
type watcher struct {
	nodes, pods, leases             cache.SharedIndexInformer
	slices, classes, claims, quotas cache.SharedIndexInformer
	draUnread, quotasUnread         string
	dirty                           chan struct{}
	// namespace, when set, is the tenant's: only its pods and quotas are
	// watched, and the cluster's capacity is read from capacityRef every
	// maxRebuild.
	namespace, capacityRef string
	client                 kubernetes.Interface
	inventories            inventoryCache
}

// newWatcher starts the watches and waits for their first lists.
func newWatcher(ctx context.Context, c kubernetes.Interface) (*watcher, error) {
	w := &watcher{dirty: make(chan struct{}, 1), client: c}
	all := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(stripManagedFields))
	leases := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(kubeinterface.LeaseNamespace),
		informers.WithTransform(stripManagedFields))
	// Finished pods hold nothing.
	unfinished := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(stripManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "status.phase!=Succeeded,status.phase!=Failed"
		}))
	w.nodes = all.Core().V1().Nodes().Informer()
	w.pods = unfinished.Core().V1().Pods().Informer()
	w.leases = leases.Coordination().V1().Leases().Informer()
	for _, need := range []struct {
		what string
		try  func() error
	}{
		{"nodes", func() error { return listAndWatch(ctx, c.CoreV1().Nodes()) }},
		{"pods", func() error { return listAndWatch(ctx, c.CoreV1().Pods(metav1.NamespaceAll)) }},
		{"the nodes' Leases", func() error { return listAndWatch(ctx, c.CoordinationV1().Leases(kubeinterface.LeaseNamespace)) }},
	} {
		if err := need.try(); err != nil {
			return nil, fmt.Errorf("list and watch %s (kubegpu ui needs the role kubegpu-viewer of this version): %w", need.what, err)
		}
	}
	// What a role from before kubegpu read them may not list is said on
	// the page; any other error fails the start.
	for _, opt := range []struct {
		what string
		try  func() error
		inf  func() cache.SharedIndexInformer
		into *cache.SharedIndexInformer
	}{
		{"the ResourceSlices of other DRA drivers", func() error { return listAndWatch(ctx, c.ResourceV1().ResourceSlices()) },
			all.Resource().V1().ResourceSlices().Informer, &w.slices},
		{"the DeviceClasses", func() error { return listAndWatch(ctx, c.ResourceV1().DeviceClasses()) },
			all.Resource().V1().DeviceClasses().Informer, &w.classes},
		{"the GPUs that ResourceClaims hold", func() error { return listAndWatch(ctx, c.ResourceV1().ResourceClaims(metav1.NamespaceAll)) },
			all.Resource().V1().ResourceClaims().Informer, &w.claims},
		{"ResourceQuotas", func() error { return listAndWatch(ctx, c.CoreV1().ResourceQuotas(metav1.NamespaceAll)) },
			all.Core().V1().ResourceQuotas().Informer, &w.quotas},
	} {
		err := opt.try()
		switch {
		case apierrors.IsForbidden(err):
			note := fmt.Sprintf("Not read: %s (%v); the role kubegpu-viewer grants it.", opt.what, err)
			if opt.into == &w.quotas {
				w.quotasUnread = note
			} else if w.draUnread == "" {
				w.draUnread = note
			}
		case err != nil:
			return nil, fmt.Errorf("list and watch %s: %w", opt.what, err)
		default:
			*opt.into = opt.inf()
		}
	}
	return w, w.start(ctx, all, leases, unfinished)
}

// newTenantWatcher watches what a tenant of namespace ns may read: its
// pods and quotas; the capacity is read from capacityRef.
func newTenantWatcher(ctx context.Context, c kubernetes.Interface, ns, capacityRef string) (*watcher, error) {
	w := &watcher{dirty: make(chan struct{}, 1), client: c, namespace: ns, capacityRef: capacityRef}
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns), informers.WithTransform(stripManagedFields))
	if err := listAndWatch(ctx, c.CoreV1().Pods(ns)); err != nil {
		return nil, fmt.Errorf("list and watch the pods of namespace %s: %w", ns, err)
	}
	w.pods = f.Core().V1().Pods().Informer()
	if err := listAndWatch(ctx, c.CoreV1().ResourceQuotas(ns)); err != nil {
		w.quotasUnread = fmt.Sprintf("Not read: the namespace's ResourceQuotas (%v).", err)
	} else {
		w.quotas = f.Core().V1().ResourceQuotas().Informer()
	}
	return w, w.start(ctx, f)
}

// start adds the handlers, starts the factories and waits for their first
// lists.
func (w *watcher) start(ctx context.Context, factories ...informers.SharedInformerFactory) error {
	mark := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.mark() },
		UpdateFunc: func(any, any) { w.mark() },
		DeleteFunc: func(any) { w.mark() },
	}
	for _, inf := range w.informers() {
		if inf == w.leases {
			// Kubelets renew every 10 s: 500 events a second at 5,000
			// nodes, and the page shows no Lease (explanations read
			// them when asked).
			continue
		}
		if _, err := inf.AddEventHandler(mark); err != nil {
			return err
		}
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	for _, inf := range w.informers() {
		if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
			return fmt.Errorf("the watches did not list the cluster within %s", syncTimeout)
		}
	}
	return nil
}

// stripManagedFields drops what the page never reads and would cost
// memory for every object held.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// listWatcher is what a typed client of one kind offers.
type listWatcher[L any] interface {
	List(context.Context, metav1.ListOptions) (L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}

// listAndWatch tries one list of one object and one watch, which ends at
// once: what the informer will do.
func listAndWatch[L any](ctx context.Context, c listWatcher[L]) error {
	if _, err := c.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return err
	}
	wi, err := c.Watch(ctx, metav1.ListOptions{TimeoutSeconds: ptr.To[int64](1)})
	if err != nil {
		return err
	}
	wi.Stop()
	return nil
}

func (w *watcher) informers() []cache.SharedIndexInformer {
	var out []cache.SharedIndexInformer
	for _, inf := range []cache.SharedIndexInformer{w.nodes, w.pods, w.leases, w.slices, w.classes, w.claims, w.quotas} {
		if inf != nil {
			out = append(out, inf)
		}
	}
	return out
}

func (w *watcher) mark() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// list is what the watches hold now, as listFromAPI lists it.
func (w *watcher) list(context.Context) (*listed, error) {
	l := &listed{draUnread: w.draUnread, claimsRead: w.claims != nil, inventories: &w.inventories}
	l.nodes = storeOf[corev1.Node](w.nodes)
	l.leases = storeOf[coordinationv1.Lease](w.leases)
	l.pods = storeOf[corev1.Pod](w.pods)
	l.slices = storeOf[resourceapi.ResourceSlice](w.slices)
	l.classes = storeOf[resourceapi.DeviceClass](w.classes)
	l.claims = storeOf[resourceapi.ResourceClaim](w.claims)
	return l, nil
}

// storeOf lists an informer's objects (none for a nil informer).
func storeOf[T any](inf cache.SharedIndexInformer) []*T {
	if inf == nil {
		return nil
	}
	objs := inf.GetStore().List()
	out := make([]*T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}

// publish rebuilds the page's view after changes, at most every
// minRebuild, and at least every maxRebuild, until ctx ends.
func (w *watcher) publish(ctx context.Context, srv *ui.Server, verify func(kubeinterface.Allocation) error) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(maxRebuild)
	defer tick.Stop()
	w.mark()
	var capa kubeinterface.Capacity
	var capaNote string
	readCapa := w.namespace != ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
		case <-tick.C:
			readCapa = w.namespace != ""
		}
		start := time.Now()
		var v ui.View
		quotas := storeOf[corev1.ResourceQuota](w.quotas)
		if w.namespace != "" {
			if readCapa {
				capa, capaNote = readCapacity(ctx, w.client, w.capacityRef)
				readCapa = false
			}
			v = tenantView(w.namespace, storeOf[corev1.Pod](w.pods), quotas, capa, capaNote, verify)
		} else {
			l, _ := w.list(ctx)
			v = uiView(l.state(verify), l.pods, quotas)
		}
		if w.quotasUnread != "" {
			sum := v.Summary.(uiSummary)
			sum.Notes = append(sum.Notes, w.quotasUnread)
			v.Summary = sum
		}
		if err := srv.Publish(v); err != nil {
			logger.Error(err, "Publish the page's view")
		}
		// At most a third of a core rebuilding, however busy the
		// cluster.
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(minRebuild, 2*time.Since(start))):
		}
	}
}
