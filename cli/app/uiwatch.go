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
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

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
}

// newWatcher starts the watches and waits for their first lists.
func newWatcher(ctx context.Context, c kubernetes.Interface) (*watcher, error) {
	w := &watcher{dirty: make(chan struct{}, 1)}
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
	for _, kind := range []struct{ what string }{{"nodes"}, {"pods"}, {"the nodes' Leases"}} {
		if err := w.mayList(ctx, c, kind.what); err != nil {
			return nil, err
		}
	}
	probe := func(what string, list func() error) bool {
		err := list()
		if apierrors.IsForbidden(err) {
			note := fmt.Sprintf("Not read: %s (%v); the role kubegpu-viewer grants it.", what, err)
			if what == "ResourceQuotas" {
				w.quotasUnread = note
			} else if w.draUnread == "" {
				w.draUnread = note
			}
			return false
		}
		return err == nil
	}
	one := metav1.ListOptions{Limit: 1}
	if probe("the ResourceSlices of other DRA drivers", func() error { _, err := c.ResourceV1().ResourceSlices().List(ctx, one); return err }) {
		w.slices = all.Resource().V1().ResourceSlices().Informer()
	}
	if probe("the DeviceClasses", func() error { _, err := c.ResourceV1().DeviceClasses().List(ctx, one); return err }) {
		w.classes = all.Resource().V1().DeviceClasses().Informer()
	}
	if probe("the GPUs that ResourceClaims hold", func() error {
		_, err := c.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, one)
		return err
	}) {
		w.claims = all.Resource().V1().ResourceClaims().Informer()
	}
	if probe("ResourceQuotas", func() error { _, err := c.CoreV1().ResourceQuotas(metav1.NamespaceAll).List(ctx, one); return err }) {
		w.quotas = all.Core().V1().ResourceQuotas().Informer()
	}
	mark := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.mark() },
		UpdateFunc: func(any, any) { w.mark() },
		DeleteFunc: func(any) { w.mark() },
	}
	for _, inf := range w.informers() {
		if _, err := inf.AddEventHandler(mark); err != nil {
			return nil, err
		}
	}
	for _, f := range []informers.SharedInformerFactory{all, leases, unfinished} {
		f.Start(ctx.Done())
	}
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	for _, inf := range w.informers() {
		if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
			return nil, fmt.Errorf("the watches did not list the cluster within %s", syncTimeout)
		}
	}
	return w, nil
}

// stripManagedFields drops what the page never reads and would cost
// memory for every object held.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// mayList fails clearly when the caller may not list what the page needs.
func (w *watcher) mayList(ctx context.Context, c kubernetes.Interface, what string) error {
	one := metav1.ListOptions{Limit: 1}
	var err error
	switch what {
	case "nodes":
		_, err = c.CoreV1().Nodes().List(ctx, one)
	case "pods":
		_, err = c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, one)
	default:
		_, err = c.CoordinationV1().Leases(kubeinterface.LeaseNamespace).List(ctx, one)
	}
	if err != nil {
		return fmt.Errorf("list %s (kubegpu ui needs the role kubegpu-viewer): %w", what, err)
	}
	return nil
}

func (w *watcher) informers() []cache.SharedIndexInformer {
	out := []cache.SharedIndexInformer{w.nodes, w.pods, w.leases}
	for _, inf := range []cache.SharedIndexInformer{w.slices, w.classes, w.claims, w.quotas} {
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
	l := &listed{draUnread: w.draUnread, claimsRead: w.claims != nil}
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
		case <-tick.C:
		}
		l, _ := w.list(ctx)
		v := uiView(l.state(verify), l.pods, storeOf[corev1.ResourceQuota](w.quotas), time.Now())
		if w.quotasUnread != "" {
			sum := v.Summary.(uiSummary)
			sum.Notes = append(sum.Notes, w.quotasUnread)
			v.Summary = sum
		}
		if err := srv.Publish(v); err != nil {
			logger.Error(err, "Publish the page's view")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(minRebuild):
		}
	}
}
