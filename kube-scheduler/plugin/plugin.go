package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/capacity"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/metrics"
	"github.com/kubegpu/kubegpu/kube-scheduler/record"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "KubeGPU"

// Plugin is the kubegpu framework plugin. One instance serves one scheduler
// profile; the profiles of one process share one device cache.
type Plugin struct {
	// ctx lives as long as the scheduler.
	ctx    context.Context
	handle fwk.Handle
	args   *Args
	// shared is what the profiles of the process share: the engine, the
	// device cache, the recorder and the metrics.
	*shared
	ready atomic.Bool
	// namespaces give each pod's namespace its enforcement policy label.
	namespaces corelisters.NamespaceLister
	// fitOnce and fitFilter: whether the profile runs NodeResourcesFit's
	// Filter (see fitFilters).
	fitOnce   sync.Once
	fitFilter bool
	// groupsOnce and groups: whether this profile places pod groups
	// whole (see placesGroups).
	groupsOnce sync.Once
	groups     bool
	// taintOnce and taintFilter: whether the profile runs
	// TaintToleration's Filter (see taintFilters).
	taintOnce   sync.Once
	taintFilter bool
	// claimDeps allocate kubegpu's ResourceClaims; nil without DRA.
	claimDeps *claimDeps
}

var (
	_ fwk.PreFilterPlugin   = (*Plugin)(nil)
	_ fwk.FilterPlugin      = (*Plugin)(nil)
	_ fwk.PostFilterPlugin  = (*Plugin)(nil)
	_ fwk.PreScorePlugin    = (*Plugin)(nil)
	_ fwk.ScorePlugin       = (*Plugin)(nil)
	_ fwk.ReservePlugin     = (*Plugin)(nil)
	_ fwk.PreBindPlugin     = (*Plugin)(nil)
	_ fwk.BindPlugin        = (*Plugin)(nil)
	_ fwk.PostBindPlugin    = (*Plugin)(nil)
	_ fwk.EnqueueExtensions = (*Plugin)(nil)
	_ fwk.SignPlugin        = (*Plugin)(nil)
)

// Name returns the plugin's name.
func (*Plugin) Name() string { return Name }

// Factory builds the plugin for each profile of a scheduler, handing the
// profiles of one scheduler (one informer factory) one shared state:
// loading a .so twice is impossible, and two device caches would hand out
// the same device twice. Register its New with the scheduler:
//
//	app.NewSchedulerCommand(app.WithPlugin(plugin.Name, plugin.NewFactory().New))
type Factory struct {
	mu sync.Mutex
	// byInformers maps a scheduler's informer factory to its state.
	byInformers map[informers.SharedInformerFactory]*shared
}

// NewFactory returns a factory that has built nothing yet.
func NewFactory() *Factory {
	return &Factory{byInformers: map[informers.SharedInformerFactory]*shared{}}
}

// New builds the plugin from its args: it loads the device modules'
// scheduler sides from the plugin directory, reads the signing key and
// registers the device cache's informer handlers (once per scheduler).
// Any problem fails the scheduler's start-up with an error that says what
// to fix.
func (f *Factory) New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	logger := klog.FromContext(ctx).WithName(Name)
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	shared, err := f.sharedState(ctx, args, h)
	if err != nil {
		return nil, err
	}
	logger.Info("kubegpu plugin ready", "profile", h.ProfileName(), "pluginDir", args.PluginDir,
		"modules", shared.modules, "nodePolicy", args.NodePolicy, "signingKey", shared.key.Algorithm()+":"+shared.key.ID())
	p := &Plugin{ctx: ctx, handle: h, args: args, shared: shared,
		namespaces: h.SharedInformerFactory().Core().V1().Namespaces().Lister()}
	if m := h.SharedDRAManager(); m != nil {
		p.claimDeps = newClaimDeps(m)
	}
	return p, nil
}

// shared is what the profiles of one scheduler share (see Factory).
type shared struct {
	args     *Args
	modules  []string
	engine   *devicescheduler.Engine
	key      *kubeinterface.Key
	cache    *devicecache.Cache
	recorder *record.Recorder
	metrics  *metrics.Metrics
	pending  *metrics.PendingPods
	synced   func() bool
}

func (f *Factory) sharedState(ctx context.Context, args *Args, h fwk.Handle) (*shared, error) {
	factory := h.SharedInformerFactory()
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.byInformers[factory]; ok {
		if !argsEqual(s.args, args) {
			return nil, fmt.Errorf("%s: every profile must give the plugin the same args: the profiles share one device cache", Name)
		}
		return s, nil
	}
	s, err := newShared(ctx, args, h)
	if err != nil {
		return nil, err
	}
	f.byInformers[factory] = s
	// The state lives as long as the scheduler that made it.
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		delete(f.byInformers, factory)
		f.mu.Unlock()
	})
	return s, nil
}

func argsEqual(a, b *Args) bool {
	return reflect.DeepEqual(a, b)
}

func newShared(ctx context.Context, args *Args, h fwk.Handle) (*shared, error) {
	logger := klog.FromContext(ctx).WithName(Name)
	factory, client := h.SharedInformerFactory(), h.ClientSet()
	key, keys, err := loadKeys(logger, args)
	if err != nil {
		return nil, err
	}
	plugins, names, err := loadSchedulerPlugins(ctx, args)
	if err != nil {
		return nil, err
	}
	engine, err := devicescheduler.New(args.EngineConfig(plugins))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	m := metrics.Register()
	// Background records have a client of their own, so that they never
	// take from the scheduler's QPS.
	recordConfig := rest.CopyConfig(h.KubeConfig())
	recordConfig.QPS, recordConfig.Burst = float32(args.RecordQPS), int(2*args.RecordQPS)
	recordClient, err := kubernetes.NewForConfig(recordConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: client for allocation records: %w", Name, err)
	}
	rec := record.New(recordClient, client, m)
	rec.StartUrgent(ctx)
	podLister := factory.Core().V1().Pods().Lister()
	c := devicecache.New(devicecache.Config{
		Engine: engine, Keys: keys, SigningKey: kubeinterface.NewKeySet(key).IDs()[0], Staleness: args.HeartbeatStaleness.Duration,
		Recorder: rec, Metrics: m,
		Activate: func(pods map[string]*corev1.Pod) { h.Activate(logger, pods) },
		ListPods: func() ([]*corev1.Pod, error) { return podLister.List(labels.Everything()) },
	})
	pending := metrics.NewPendingPods()
	// The nodes' Leases come from an informer of their own, limited to
	// kube-node-lease: the scheduler's role may read Leases there and not
	// cluster-wide (see kube-scheduler/deploy/rbac.yaml).
	leases := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(kubeinterface.LeaseNamespace))
	synced, err := addHandlers(logger, c, pending, factory, leases)
	if err != nil {
		return nil, err
	}
	leases.Start(ctx.Done())
	go c.WarmUp(ctx, synced)
	go func() {
		// A cache that never syncs stalls every GPU pod: say why, loudly.
		timer := time.NewTimer(time.Minute)
		defer timer.Stop()
		select {
		case <-ctx.Done():
		case <-timer.C:
			if !synced() {
				logger.Error(nil, "Device cache not synced after a minute: GPU pods wait. Check that the scheduler may list and watch nodes, pods, ResourceSlices, DeviceClasses and Leases in kube-node-lease (kube-scheduler/deploy/rbac.yaml)")
			}
		}
	}()
	// Reported once whole: a scrape reads c.listPods.
	metrics.RegisterGPU(ctx, c, pending, args.GPUMetrics == config.GPUMetricsPerGPU, metrics.GPUScrapeMaxAge)
	if ns, name, ok := strings.Cut(args.CapacityConfigMap, "/"); ok {
		p := &capacity.Publisher{Cache: c, Client: recordClient, Namespace: ns, Name: name}
		go func() {
			if toolscache.WaitForCacheSync(ctx.Done(), synced) {
				p.Run(ctx)
			}
		}()
	}
	return &shared{args: args, modules: names, engine: engine, key: key, cache: c, recorder: rec, metrics: m, pending: pending, synced: synced}, nil
}

// loadSchedulerPlugins loads every device module in the plugin directory
// and builds its scheduler side.
func loadSchedulerPlugins(ctx context.Context, args *Args) ([]types.SchedulerPlugin, []string, error) {
	logger := klog.FromContext(ctx).WithName(Name)
	opts, err := pluginload.ParseOptions(args.PluginOptions)
	if err != nil {
		return nil, nil, err
	}
	mods, err := pluginload.Load(args.PluginDir, args.PluginSHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("load device plugins: %w", err)
	}
	if len(mods) == 0 {
		return nil, nil, fmt.Errorf("load device plugins: no device modules (*.so) in %s: GPU pods could never be scheduled", args.PluginDir)
	}
	if err := opts.CheckModules(mods); err != nil {
		return nil, nil, err
	}
	var plugins []types.SchedulerPlugin
	var names []string
	for _, m := range mods {
		sp, err := m.SchedulerPlugin(klog.NewContext(ctx, logger.WithValues("module", m.Name())),
			types.PluginConfig{Options: opts[m.Name()]})
		switch {
		case errors.Is(err, types.ErrNotImplemented):
			logger.V(2).Info("Device module has no scheduler side", "module", m.Name(), "path", m.Path)
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("device module %s (%s): %w", m.Name(), m.Path, err)
		}
		plugins = append(plugins, sp)
		names = append(names, m.Name())
	}
	return plugins, names, nil
}

// addHandlers feeds the cache from the scheduler's shared informers: nodes
// and pods (the scheduler's pod informer leaves out finished pods), and from
// the plugin's own informer of the nodes' Leases in kube-node-lease. It
// returns a function that reports whether every handler has seen its
// informer's initial list.
func addHandlers(logger klog.Logger, c *devicecache.Cache, pending *metrics.PendingPods, factory, leases informers.SharedInformerFactory) (func() bool, error) {
	updatePod := func(p *corev1.Pod) {
		c.UpdatePod(logger, p)
		if p.Spec.NodeName != "" {
			pending.Remove(p.UID)
			metrics.ObserveRunning(c, p)
		}
	}
	var regs []toolscache.ResourceEventHandlerRegistration
	add := func(inf toolscache.SharedIndexInformer, h toolscache.ResourceEventHandler) error {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("%s: add informer handler: %w", Name, err)
		}
		regs = append(regs, reg)
		return nil
	}
	err := errors.Join(
		add(factory.Core().V1().Nodes().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withObject(obj, func(n *corev1.Node) { c.UpdateNode(logger, n) }) },
			UpdateFunc: func(_, obj any) { withObject(obj, func(n *corev1.Node) { c.UpdateNode(logger, n) }) },
			DeleteFunc: func(obj any) { withObject(obj, func(n *corev1.Node) { c.DeleteNode(n.Name) }) },
		}),
		add(factory.Core().V1().Pods().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withObject(obj, updatePod) },
			UpdateFunc: func(_, obj any) { withObject(obj, updatePod) },
			DeleteFunc: func(obj any) {
				withObject(obj, func(p *corev1.Pod) {
					c.Forget(logger, p.UID)
					pending.Remove(p.UID)
				})
			},
		}),
		// Other DRA drivers' slices and the DeviceClasses: what kubegpu
		// leaves to DRA (devicecache/dra.go). The same informers as the
		// DynamicResources plugin's.
		add(factory.Resource().V1().ResourceSlices().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { withObject(obj, func(s *resourcev1.ResourceSlice) { c.UpdateResourceSlice(logger, s) }) },
			UpdateFunc: func(_, obj any) {
				withObject(obj, func(s *resourcev1.ResourceSlice) { c.UpdateResourceSlice(logger, s) })
			},
			DeleteFunc: func(obj any) {
				withObject(obj, func(s *resourcev1.ResourceSlice) { c.DeleteResourceSlice(logger, s.Name) })
			},
		}),
		// kubegpu's claims hold devices as pods do (devicecache/claims.go).
		add(factory.Resource().V1().ResourceClaims().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withObject(obj, func(rc *resourcev1.ResourceClaim) { c.UpdateClaim(logger, rc) }) },
			UpdateFunc: func(_, obj any) { withObject(obj, func(rc *resourcev1.ResourceClaim) { c.UpdateClaim(logger, rc) }) },
			DeleteFunc: func(obj any) { withObject(obj, func(rc *resourcev1.ResourceClaim) { c.Forget(logger, rc.UID) }) },
		}),
		add(factory.Resource().V1().DeviceClasses().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withObject(obj, c.UpdateDeviceClass) },
			UpdateFunc: func(_, obj any) { withObject(obj, c.UpdateDeviceClass) },
			DeleteFunc: func(obj any) { withObject(obj, func(d *resourcev1.DeviceClass) { c.DeleteDeviceClass(d.Name) }) },
		}),
		add(leases.Coordination().V1().Leases().Informer(), toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				withObject(obj, func(l *coordinationv1.Lease) { c.UpdateLease(l, initial) })
			},
			UpdateFunc: func(_, obj any) { withObject(obj, func(l *coordinationv1.Lease) { c.UpdateLease(l, false) }) },
			DeleteFunc: func(obj any) { withObject(obj, c.DeleteLease) },
		}),
	)
	if err != nil {
		return nil, err
	}
	return func() bool {
		for _, r := range regs {
			if !r.HasSynced() {
				return false
			}
		}
		return true
	}, nil
}

// withObject calls f with obj as a T, unwrapping the tombstones of deletes
// the informer missed.
func withObject[T any](obj any, f func(T)) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if t, ok := obj.(T); ok {
		f(t)
	}
}

// waitForSync blocks the first scheduling cycles of GPU pods until the
// cache has seen every node, pod and Lease, so that a restarted scheduler
// never hands out devices that running pods hold. It reports whether the
// cache is also warm (see devicecache.Cache.WarmUp): until then GPU pods wait,
// rather than be refused (with a preemption dry run each) for nodes the
// scheduler merely has not yet seen alive.
func (p *Plugin) waitForSync(ctx context.Context) (bool, error) {
	if p.ready.Load() {
		return true, nil
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), p.synced) {
		return false, fmt.Errorf("device cache not synced: %w", context.Cause(ctx))
	}
	if !p.cache.Warmed() {
		return false, nil
	}
	p.ready.Store(true)
	return true, nil
}

// SignPod lets the scheduler batch pods that ask for no devices; pods with
// devices, or ResourceClaims (which may be kubegpu's), are never batched,
// since each one changes the node it lands on.
func (p *Plugin) SignPod(_ context.Context, pod *corev1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if objects.WantsDevices(pod) || len(pod.Spec.ResourceClaims) > 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with devices are not batched")
	}
	return []fwk.SignFragment{{Key: "kubegpu.io/devices", Value: false}}, nil
}

// sharedKeyFile says whether others than the scheduler may read the key
// file: anyone, or a group other than the scheduler's own (a Secret volume
// with fsGroup, as the Helm chart mounts it, is readable by the
// scheduler's group only).
func sharedKeyFile(fi os.FileInfo) bool {
	perm := fi.Mode().Perm()
	if perm&0o007 != 0 {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return perm&0o070 != 0 && (!ok || int(st.Gid) != os.Getegid())
}

// loadKeys reads the key the scheduler signs with and the set of keys whose
// allocations it counts: the signing key's public half and the
// verification keys.
func loadKeys(logger klog.Logger, args *Args) (*kubeinterface.Key, *kubeinterface.KeySet, error) {
	key, err := kubeinterface.LoadSigningKey(args.SigningKeyFile)
	if err != nil {
		return nil, nil, err
	}
	if fi, err := os.Stat(args.SigningKeyFile); err == nil && sharedKeyFile(fi) {
		logger.Info("WARNING: the signing key file is readable by others, or by a group other than the scheduler's: anyone who reads it can mint allocations; chmod 600 it", "file", args.SigningKeyFile, "mode", fi.Mode().Perm().String())
	}
	if key.Algorithm() == kubeinterface.AlgHMACSHA256 {
		logger.Info("WARNING: the signing key is a shared HMAC secret: every node that holds it can mint allocations for any pod on any node; use an Ed25519 key", "file", args.SigningKeyFile)
	}
	keys := kubeinterface.NewKeySet(key)
	if args.VerificationKeysFile != "" {
		more, err := kubeinterface.LoadVerifyKeys(args.VerificationKeysFile)
		if err != nil {
			return nil, nil, err
		}
		keys = kubeinterface.NewKeySet(append([]*kubeinterface.Key{key}, more.Keys()...)...)
	}
	return key, keys, nil
}

// NewOverCache is the plugin over a device cache the caller feeds, without
// informers, records or a framework handle: for tools and tests that drive
// its extension points directly (PreFilter, Filter, Score, NormalizeScore)
// to see what the scheduler decides. Pods' namespaces come from
// namespaces.
func NewOverCache(ctx context.Context, args *Args, c *devicecache.Cache, namespaces corelisters.NamespaceLister) *Plugin {
	p := &Plugin{ctx: ctx, args: args, shared: &shared{engine: c.Engine(), cache: c, pending: metrics.NewPendingPods()}, namespaces: namespaces}
	p.ready.Store(true)
	return p
}
