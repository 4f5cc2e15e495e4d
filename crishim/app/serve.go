package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/crishim/claimplugin"
	"github.com/kubegpu/kubegpu/crishim/draclaims"
	"github.com/kubegpu/kubegpu/crishim/enforce"
	"github.com/kubegpu/kubegpu/crishim/ledger"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/nodeplugins"
	"github.com/kubegpu/kubegpu/crishim/proxy"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/version"
)

type serveOptions struct {
	pluginOptions
	Listen          string
	RuntimeEndpoint string
	AllocationKey   string
	Kubeconfig      string
	Advertise       bool
	PublishSlices   bool
	Interval        time.Duration
	SlicesPerDevice int
	MetricsAddress  string
	GPUAllowlist    string
	PodResources    string
	KubeletPlugin   bool
	KubeletRootDir  string
	ClaimsDir       string
}

func (o *serveOptions) addFlags(cmd *cobra.Command) {
	o.pluginOptions.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.Listen, "listen", "/run/kubegpu/crishim.sock", "unix socket to serve CRI on (kubelet's --container-runtime-endpoint)")
	f.StringVar(&o.RuntimeEndpoint, "runtime-endpoint", "unix:///run/containerd/containerd.sock", "the container runtime's CRI endpoint")
	f.StringVar(&o.AllocationKey, "allocation-key", "/etc/kubegpu/allocation-key.pub.pem", "the scheduler's Ed25519 public keys (PEM; several during a key rotation) that allocations must be signed with; a private key is refused")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig with the node's credentials (kubelet's, system:node:NODE) for publishing its devices (default: in-cluster configuration)")
	f.BoolVar(&o.Advertise, "advertise", true, "publish the node's devices and capacity on its Node")
	f.BoolVar(&o.PublishSlices, "publish-resource-slices", true, "with --advertise, publish the node's devices as ResourceSlices of driver "+dra.DriverName+" (resource.k8s.io/v1), tainted so that DRA's allocator leaves them to kubegpu-scheduler")
	f.DurationVar(&o.Interval, "interval", 10*time.Second, "how often devices are discovered and the Node compared with them")
	f.IntVar(&o.SlicesPerDevice, "slices-per-device", advertiser.DefaultSlicesPerDevice, "nvidia.com/gpu capacity published per device, so that kubelet admits shared slices")
	f.StringVar(&o.GPUAllowlist, "gpu-allowlist", "", "file listing the namespaces (optionally with a pod label selector) whose containers keep the GPUs they ask for and may be privileged with GPUs, e.g. a DCGM exporter's; empty: none")
	f.StringVar(&o.PodResources, "pod-resources-endpoint", "unix:///var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's PodResources API, asked which GPUs prepared DRA claims hold while another DRA driver publishes the node's GPUs (with --advertise); empty: not asked, and GPU containers are refused while another driver publishes the node's GPUs")
	f.BoolVar(&o.KubeletPlugin, "dra-kubelet-plugin", true, "with --advertise, serve kubelet as the DRA driver "+dra.DriverName+": prepare the ResourceClaims kubegpu-scheduler allocated (their signed allocations verified)")
	f.StringVar(&o.KubeletRootDir, "kubelet-root-dir", "/var/lib/kubelet", "kubelet's --root-dir, where the DRA kubelet plugin registers")
	f.StringVar(&o.ClaimsDir, "claims-dir", "/var/lib/kubegpu/claims", "where the DRA kubelet plugin keeps the CDI specs of the prepared ResourceClaims")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", "", "host:port to serve /metrics (Prometheus text format) and /healthz on, e.g. 127.0.0.1:10368; empty: off")
}

// run serves CRI and advertises the node's devices until ctx ends.
func (o *serveOptions) run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", o.NodeName)
	ctx = klog.NewContext(ctx, logger)
	if o.NodeName == "" {
		return errors.New("--node-name is required (the host name could not be read)")
	}
	keys, err := kubeinterface.LoadVerifyKeys(o.AllocationKey)
	if err != nil {
		return err
	}
	if keys.HasHMAC() {
		if err := privateFile(o.AllocationKey); err != nil {
			return fmt.Errorf("allocation key %s holds a shared HMAC secret, which anyone who reads it can mint allocations with: %w", o.AllocationKey, err)
		}
		logger.Info("WARNING: the allocation key file holds a shared HMAC secret: anyone who holds it, this node included, can mint allocations for any pod on any node; use the scheduler's Ed25519 public key", "file", o.AllocationKey)
	}
	allowlist, err := rewrite.LoadAllowlist(o.GPUAllowlist)
	if err != nil {
		return err
	}
	// The shim is the node's only CRI endpoint: a device problem must not
	// take the node's containers down. Modules that do not load or start
	// are left out and reported (moduleStatus): containers are refused the
	// devices they would serve, and get no other (rewrite.Baseline hides
	// NVIDIA GPUs whatever is loaded).
	plugins, failures := o.open(ctx)
	for _, f := range failures {
		logger.Error(f.Err, "Device module failed; serving CRI without it, refusing containers its devices", "module", f.Module)
	}
	defer func() {
		if err := nodeplugins.Close(plugins); err != nil {
			logger.Error(err, "Closing device modules")
		}
	}()
	modules := newModuleStatus(o.PluginDir, plugins, failures)

	m := metrics.New()
	modules.record(m)
	d := &discovery{plugins: plugins, metrics: m}
	if _, err := d.discover(ctx); err != nil {
		logger.Error(err, "First device discovery failed; serving CRI without those devices and retrying")
	}
	var client advertiser.Client
	var slices *advertiser.Slices
	var clientset kubernetes.Interface
	var guard *draclaims.Guard
	if o.Advertise {
		cfg, err := o.restConfig()
		if err != nil {
			return err
		}
		if client, err = advertiser.NewClient(cfg); err != nil {
			return err
		}
		if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes client for ResourceSlices: %w", err)
		}
		if guard, err = newGuard(o.NodeName, o.PodResources); err != nil {
			return err
		}
		if o.PublishSlices {
			slices = newSlices(clientset, o.NodeName, m)
		} else {
			// Ended with the shim, whether or not it got through.
			uctx, cancel := context.WithCancel(ctx)
			wait := unpublishInBackground(uctx, cfg, o.NodeName, o.Interval)
			defer func() {
				cancel()
				wait()
			}()
		}
	}

	runtime, err := dialRuntime(o.RuntimeEndpoint)
	if err != nil {
		return err
	}
	defer runtime.Close()
	var cdiOff atomic.Bool
	book := ledger.New(ledger.Options{Runtime: runtime, Capacity: func(id string) (types.Device, bool) { return rewrite.Device(d.modules(), id) }})
	if held, err := book.Held(ctx); err != nil {
		logger.Error(err, "Cannot read the device ledger yet; GPU containers are refused until the runtime answers")
	} else {
		logger.Info("Device ledger read from the runtime", "devicesHeld", len(held), "held", held)
	}
	rewriter := &rewrite.Rewriter{Node: o.NodeName, Keys: keys, Modules: d.modules, Failed: modules.failed()}
	claimStore := &claimplugin.Store{Dir: o.ClaimsDir, Node: o.NodeName, Keys: keys}
	if clientset != nil && o.KubeletPlugin {
		kp, err := claimplugin.Start(ctx, claimStore, claimplugin.Options{KubeletRootDir: o.KubeletRootDir, Client: clientset})
		if err != nil {
			return err
		}
		defer kp.Stop()
	}
	p, err := proxy.New(proxy.Options{
		Backend: o.RuntimeEndpoint,
		CreateContainer: proxy.CreateContainer(proxy.Devices{
			Rewriter:     rewriter,
			Allowlist:    allowlist,
			HostGPUNodes: func() []string { return rewrite.HostGPUNodes("/dev") },
			Ledger:       book,
			Metrics:      m,
			CDIOff:       cdiOff.Load,
			DRA:          draClaims(guard),
			Claims:       claimStore,
		}),
		Metrics: m,
	})
	if err != nil {
		return err
	}
	l, err := proxy.Listen(o.Listen)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { watchCDI(ctx, runtime, &cdiOff, o.Interval) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- p.Serve(l) })
	if o.MetricsAddress != "" {
		// Metrics are not worth the node's containers: without them the
		// shim still serves CRI.
		if ml, err := net.Listen("tcp", o.MetricsAddress); err != nil {
			logger.Error(err, "Cannot serve metrics; serving CRI without them", "address", o.MetricsAddress)
		} else {
			srv := metrics.NewServer(m.Handler(modules.health))
			wg.Go(func() {
				if err := srv.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
					logger.Error(err, "Serving metrics")
				}
			})
			stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
			defer func() {
				stop()
				_ = srv.Close()
			}()
		}
	}
	if client != nil {
		cond := modules.condition()
		a, err := advertiser.New(advertiser.Options{Node: o.NodeName, Client: client, Discover: d.discover,
			Interval: o.Interval, SlicesPerDevice: o.SlicesPerDevice, Metrics: m, Condition: &cond, KeyIDs: keys.IDs(), Slices: slices, DRA: guard})
		if err != nil {
			return err
		}
		wg.Go(func() { a.Run(ctx) })
		wg.Go(func() { guard.Run(ctx, clientset) })
		if slices != nil {
			wg.Go(func() { slices.Run(ctx) })
		}
	} else {
		// Keep the device list fresh for CreateContainer.
		wg.Go(func() { d.loop(ctx, o.Interval) })
	}
	wg.Go(func() { releasePods(ctx, runtime, plugins, o.Interval) })
	// Every running slice is proven, or recorded as what it is: records go
	// to the API with the node's credentials; without an API client,
	// containers are still stopped under Required.
	pods, _ := client.(enforce.Pods)
	checker := enforce.New(enforce.Options{Node: o.NodeName, Rewriter: rewriter, Claims: claimStore, Runtime: runtime, Pods: pods, Metrics: m, Interval: o.Interval})
	wg.Go(func() { checker.Run(ctx) })
	logger.Info("kubegpu-crishim serving", "version", version.Get().GitVersion, "listen", o.Listen, "runtime", o.RuntimeEndpoint,
		"modules", modules.started, "failedModules", modules.failed(), "advertise", client != nil, "keys", keys.IDs(), "allowlistEntries", allowlist.Len())
	select {
	case <-ctx.Done():
		logger.Info("Shutting down")
		p.Stop(5 * time.Second)
		wg.Wait()
		return nil
	case err := <-serveErr:
		return fmt.Errorf("serve CRI on %s: %w", o.Listen, err)
	}
}

func (o *serveOptions) restConfig() (*rest.Config, error) {
	return restConfig(o.Kubeconfig)
}

// restConfig is the node's credentials: kubeconfig, or the in-cluster
// configuration without one.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client (set --kubeconfig, or --advertise=false): %w", err)
	}
	cfg.UserAgent = "kubegpu-crishim/" + version.Get().GitVersion
	return cfg, nil
}

// discovery runs the modules' discovery and keeps, per module, the devices
// it serves, for the container rewrite.
type discovery struct {
	plugins []nodeplugins.Plugin
	metrics *metrics.Shim
	current atomic.Pointer[[]rewrite.Module]
}

// discover asks every module for its devices and returns them merged. A
// module whose discovery fails keeps its last devices.
func (d *discovery) discover(ctx context.Context) (types.Inventory, error) {
	prev := d.current.Load()
	mods := make([]rewrite.Module, len(d.plugins))
	invs := make([]types.Inventory, 0, len(d.plugins))
	var errs []error
	for i, p := range d.plugins {
		inv, err := p.Discover(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("device module %s: %w", p.Module, err))
			if prev != nil {
				mods[i] = (*prev)[i]
			} else {
				// Never discovered: it serves no devices yet.
				mods[i] = rewrite.Module{Name: p.Module, Plugin: p.NodePlugin, Devices: map[string]types.Device{}}
			}
			continue
		}
		devices := make(map[string]types.Device, len(inv.Devices))
		for _, dev := range inv.Devices {
			devices[dev.ID] = dev
		}
		mods[i] = rewrite.Module{Name: p.Module, Plugin: p.NodePlugin, Devices: devices}
		invs = append(invs, inv)
	}
	d.current.Store(&mods)
	merged, err := advertiser.MergeInventories(invs...)
	if err != nil {
		return types.Inventory{}, err
	}
	d.metrics.Devices.Set(int64(len(merged.Devices)))
	return merged, errors.Join(errs...)
}

func (d *discovery) modules() []rewrite.Module {
	if m := d.current.Load(); m != nil {
		return *m
	}
	return nil
}

func (d *discovery) loop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := d.discover(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Device discovery failed")
			}
		}
	}
}

// releasePods tells the modules that start something per pod (an MPS
// daemon per container) which pods still have a sandbox, every interval, so
// that they stop what they started for the others.
func releasePods(ctx context.Context, runtime *runtimeClient, plugins []nodeplugins.Plugin, interval time.Duration) {
	var scoped []types.PodScopedPlugin
	for _, p := range plugins {
		if ps, ok := p.NodePlugin.(types.PodScopedPlugin); ok {
			scoped = append(scoped, ps)
		}
	}
	if len(scoped) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		listed := time.Now()
		listCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		live, err := runtime.LivePods(listCtx)
		cancel()
		if err != nil {
			logger.V(2).Info("Cannot list pod sandboxes; releasing nothing this round", "err", err)
			continue
		}
		for _, ps := range scoped {
			if err := ps.ReleasePods(ctx, live, listed); err != nil {
				logger.Error(err, "Releasing what device modules hold for pods that are gone")
			}
		}
	}
}

// watchCDI asks the runtime every interval whether it ignores CDI devices
// (its configuration can change with a restart), and says so loudly when
// that changes: containers given CDI devices are then refused rather than
// started without their GPUs. Until the runtime first answers, they are
// let through.
func watchCDI(ctx context.Context, runtime *runtimeClient, off *atomic.Bool, interval time.Duration) {
	logger := klog.FromContext(ctx)
	known := false
	for {
		askCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		isOff, err := runtime.CDIOff(askCtx)
		cancel()
		if err == nil {
			if was := off.Swap(isOff); isOff && (!known || !was) {
				logger.Error(proxy.ErrCDIOff, "Containers given CDI devices will be refused")
			} else if !isOff && known && was {
				logger.Info("The container runtime injects CDI devices again")
			}
			known = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// privateFile checks that path is root's (or this process's user's) and
// readable by no one else.
func privateFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (st.Uid != 0 && st.Uid != uint32(os.Geteuid())) {
		return fmt.Errorf("it is not owned by root: chown root %s", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("it is readable by group or others (%s): chmod 600 %s", fi.Mode().Perm(), path)
	}
	return nil
}
