package devicecache

import (
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// Cache is the scheduler's view of every node's devices and of the
// devices that pods hold, built from informer events only: node inventories
// (annotation), liveness (the nodes' Leases and Ready conditions) and pods'
// verified allocations (the scheduler's record first). A
// restart rebuilds the same state from the API.
//
// Pods are counted from the moment Reserve assumes them; once the pod is
// bound with a valid allocation it is confirmed, and it is released when it
// is deleted or finishes (the scheduler's pod informer drops Succeeded and
// Failed pods). An allocation that is not signed by this scheduler's key, or
// is bound to another pod or node, holds nothing: kubegpu-crishim refuses to
// start such containers with devices.
//
// All methods are safe for concurrent use: Evaluate-style reads take the
// read lock, changes the write lock.
type Cache struct {
	engine *devicescheduler.Engine
	keys   *kubeinterface.KeySet
	// formOnly: see Config.FormOnly.
	formOnly bool
	// signingKey is the ID ("ALGORITHM:KEYID") of the key the scheduler
	// signs with: nodes whose shims say they refuse it get no GPU pods.
	// Empty: not checked.
	signingKey string
	staleness  time.Duration
	now        func() time.Time
	// started is when the cache was made, before its informers started,
	// and the origin of the clock the nodes' Lease observations are kept
	// on (see since): it must not change afterwards. warmed is set once
	// the cache has seen the nodes' Leases renewed since.
	started time.Time
	warmed  atomic.Bool
	metrics Metrics

	mu    sync.RWMutex
	nodes map[string]*nodeState
	// byObject holds the same states by the Node object the informer
	// last handed the cache for them, which the scheduler's NodeInfo
	// shares: Filter and Score find a node by a pointer, without hashing
	// and comparing its name (see lookup).
	byObject map[*corev1.Node]*nodeState
	// taints counts the nodes that publish devices by their hard taints
	// (see DeviceNodesTolerated).
	taints deviceTaints

	pods map[ktypes.UID]*podState

	// recorder queues the scheduler's records of allocations.
	recorder Recorder

	// activate moves pods back to the scheduling queue.
	activate func(pods map[string]*corev1.Pod)
	// liveWaiters are the pods refused by some node for not being live;
	// they are activated when a node is live again (the scheduler learns
	// of the Leases only through this cache). deviceWaiters are the pods
	// refused for want of devices; they are activated once the cache has
	// freed devices or rebuilt an inventory (see waitSet). draWaiters are
	// the pods refused for DRA's sake; they are activated when a conflict
	// with DRA ends (see dra.go).
	liveWaiters, deviceWaiters, draWaiters *waitSet
	// dra is what the cache knows of other DRA drivers' ResourceSlices and
	// of DeviceClasses; guarded by mu.
	dra draState

	// learnMu guards learnState and gone: the pods forgotten while the mix
	// is learned from the pods listed at start (see LearnPods).
	learnMu    sync.Mutex
	learnState learnState
	gone       map[ktypes.UID]struct{}
	// listPods lists the pods the scheduler's informer holds.
	listPods func() ([]*corev1.Pod, error)

	shapeMu sync.Mutex
	shapes  map[ShapeKey]uint32
	// shapeEpoch counts the times the shape table was full and started
	// over; memo results of an older epoch are not reused.
	shapeEpoch uint64
}

// Recorder queues the scheduler's records of allocations (see package
// record): the cache asks for them from its informer handlers, which never
// write to the API themselves.
type Recorder interface {
	// Add asks the leader to record pod uid's allocation value.
	Add(uid ktypes.UID, pod ktypes.NamespacedName, value string)
	// AddUrgent asks any replica to record it at once: the pod's
	// annotation no longer says what it holds.
	AddUrgent(uid ktypes.UID, pod ktypes.NamespacedName, value string)
	// Forget drops what is queued for a pod that is gone or recorded.
	Forget(uid ktypes.UID)
}

// Metrics counts the allocations the cache does not count.
type Metrics interface {
	Rejected(err error)
}

// Config is what a Cache is built from. Engine is required.
type Config struct {
	Engine *devicescheduler.Engine
	// Keys verify the allocations of bound pods. Without them a pod's
	// allocation holds nothing, unless FormOnly is set.
	Keys *kubeinterface.KeySet
	// FormOnly, without Keys, counts allocations checked for their form
	// and their pod and node only (`kubegpu explain` run without keys).
	FormOnly bool
	// SigningKey is the ID ("ALGORITHM:KEYID") of the key the scheduler
	// signs with: nodes whose shims refuse it get no GPU pods. Empty: not
	// checked.
	SigningKey string
	// Staleness is the age of a node's last Lease renewal, on the cache's
	// clock, beyond which the node gets no GPU pods.
	Staleness time.Duration
	// Recorder and Metrics may be nil.
	Recorder Recorder
	Metrics  Metrics
	// Activate moves pods back to the scheduling queue; may be nil.
	Activate func(pods map[string]*corev1.Pod)
	// ListPods lists the pods the scheduler's informer holds, to learn
	// the workload mix from; may be nil.
	ListPods func() ([]*corev1.Pod, error)
	// Now is the cache's clock; time.Now if nil. The cache starts at its
	// first reading.
	Now func() time.Time
}

// New returns an empty cache; feed it with the informers' events.
func New(cfg Config) *Cache {
	c := &Cache{
		engine: cfg.Engine, keys: cfg.Keys, formOnly: cfg.FormOnly, signingKey: cfg.SigningKey, staleness: cfg.Staleness, now: cfg.Now,
		metrics: cfg.Metrics, recorder: cfg.Recorder, activate: cfg.Activate, listPods: cfg.ListPods,
		nodes: map[string]*nodeState{}, byObject: map[*corev1.Node]*nodeState{}, pods: map[ktypes.UID]*podState{},
		liveWaiters: newWaitSet(), deviceWaiters: newWaitSet(), draWaiters: newWaitSet(), shapes: map[ShapeKey]uint32{},
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.started = c.now()
	if c.metrics == nil {
		c.metrics = noMetrics{}
	}
	if c.recorder == nil {
		c.recorder = noRecorder{}
	}
	if c.activate == nil {
		c.activate = func(map[string]*corev1.Pod) {}
	}
	if c.listPods == nil {
		c.listPods = func() ([]*corev1.Pod, error) { return nil, nil }
	}
	return c
}

type noMetrics struct{}

func (noMetrics) Rejected(error) {}

type noRecorder struct{}

func (noRecorder) Add(ktypes.UID, ktypes.NamespacedName, string)       {}
func (noRecorder) AddUrgent(ktypes.UID, ktypes.NamespacedName, string) {}
func (noRecorder) Forget(ktypes.UID)                                   {}

// Now is the time on the cache's clock.
func (c *Cache) Now() time.Time { return c.now() }

// Started is when the cache was made.
func (c *Cache) Started() time.Time { return c.started }

// Warmed reports whether the cache has seen the nodes' Leases renewed since
// it started (see WarmUp).
func (c *Cache) Warmed() bool { return c.warmed.Load() }

// Engine is the allocation engine the cache evaluates with.
func (c *Cache) Engine() *devicescheduler.Engine { return c.engine }
