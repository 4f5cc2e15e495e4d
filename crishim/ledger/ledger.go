package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// ErrConflict is wrapped when a container's devices are held by another
// pod's live container: an exclusive device already held, or slices over a
// device's capacity.
var ErrConflict = errors.New("devices are held by another pod")

// ErrUnavailable is wrapped when the runtime could not be asked what live
// containers hold.
var ErrUnavailable = errors.New("the device ledger cannot be read")

// DefaultPendingTTL is how long, at most, a claim whose container the
// runtime does not list keeps its devices when nobody releases it (its
// CreateContainer call was reset or its connection lost, so that the
// runtime may still be creating the container) and its pod's sandbox stays
// ready: kubelet's CRI request timeout.
const DefaultPendingTTL = 2 * time.Minute

// listTimeout bounds one listing of the runtime's containers.
const listTimeout = 10 * time.Second

// Lister is what the ledger asks the container runtime.
type Lister interface {
	// ListContainers lists the runtime's containers that match filter
	// (the ledger label).
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	// LivePods returns the UIDs of the pods that have a ready sandbox: a
	// claim of any other pod is dropped, since no container of it can be
	// created any more.
	LivePods(ctx context.Context) (map[string]bool, error)
}

// Claim is what a container about to be created will hold.
type Claim struct {
	// PodUID is the UID of the container's pod: a pod's containers never
	// conflict with each other (its allocation is one signed whole).
	PodUID string
	// Pod is namespace/name, for logs.
	Pod string
	// Container is the container's name in the pod.
	Container string
	// Attempt is the container's restart count, as kubelet passes it.
	Attempt uint32
	// Devices are the devices the container gets through its pod's
	// allocation.
	Devices []types.DeviceShare
	// ClaimDevices are the devices the container gets through its pod's
	// kubegpu ResourceClaims, each with its claim's UID, in the order of
	// the container's edits: recorded with the container (the enforcement
	// checker proves them), counted as an allocation's where they are
	// slices. The claims' whole GPUs are held through DRA.
	ClaimDevices []kubeinterface.HeldDevice
	// DRA are the kubegpu devices the container's pod holds whole through
	// ResourceClaims, of another DRA driver or kubegpu's: shared with
	// other pods' DRA holdings (a shared claim), never with kubegpu's.
	DRA []string
}

// Options configure a Ledger.
type Options struct {
	// Runtime lists the containers.
	Runtime Lister
	// Capacity returns a device of this node (its memory bounds the slices
	// on it), or false.
	Capacity func(id string) (types.Device, bool)
	// PendingTTL is DefaultPendingTTL if zero.
	PendingTTL time.Duration
	// Now is time.Now if nil.
	Now func() time.Time
}

// Ledger checks a container's devices against those that live containers
// hold, read from the runtime on every check: the containers the shim gave
// devices carry them in their labels and annotations (Labels), so a
// restarted shim knows what it knew. A claim made for a container being
// created is kept in memory while its CreateContainer call is in flight:
// until the caller releases it (the runtime answered, so the container
// is listed or was not created), the runtime lists its container, its
// pod's sandbox is no longer ready, or PendingTTL passes.
//
// A Ledger is safe for concurrent use; checks are serialized.
type Ledger struct {
	opts Options
	mu   sync.Mutex
	// pending holds one claim per CreateContainer call in flight, by a
	// number of its own: retries of one container (same pod, name and
	// attempt) each keep theirs, as an earlier call may still be creating
	// the container after its client gave up.
	pending map[uint64]pending
	seq     uint64 // the last claim's number
}

type pending struct {
	claim Claim
	key   string // claimKey: the container it is for
	until time.Time
}

// New returns a ledger.
func New(opts Options) *Ledger {
	if opts.PendingTTL == 0 {
		opts.PendingTTL = DefaultPendingTTL
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Ledger{opts: opts, pending: map[uint64]pending{}}
}

func claimKey(podUID, container string, attempt uint32) string {
	return fmt.Sprintf("%s/%s/%d", podUID, container, attempt)
}

// Labels are the labels and annotations that put a container holding c's
// devices in the ledger.
func Labels(c Claim) (labels, annotations map[string]string, err error) {
	held, err := kubeinterface.EncodeHeld(c.held())
	if err != nil {
		return nil, nil, err
	}
	annotations = map[string]string{kubeinterface.AnnotationContainerHeld: held}
	if len(c.DRA) > 0 {
		if annotations[kubeinterface.AnnotationContainerDRAHeld], err = kubeinterface.EncodeHeld(draShares(c.DRA)); err != nil {
			return nil, nil, err
		}
	}
	return map[string]string{kubeinterface.LabelContainerLedger: kubeinterface.LedgerVersion, kubeinterface.LabelContainerPodUID: c.PodUID},
		annotations, nil
}

// held is what c holds through kubegpu: its allocation's devices, then
// its claims', in the order the container's edits were made from.
func (c Claim) held() []kubeinterface.HeldDevice {
	out := make([]kubeinterface.HeldDevice, 0, len(c.Devices)+len(c.ClaimDevices))
	for _, d := range c.Devices {
		out = append(out, kubeinterface.HeldDevice{DeviceShare: d})
	}
	return append(out, c.ClaimDevices...)
}

// draShares are DRA-held device IDs as whole-device shares.
func draShares(ids []string) []kubeinterface.HeldDevice {
	out := make([]kubeinterface.HeldDevice, len(ids))
	for i, id := range ids {
		out[i] = kubeinterface.HeldDevice{DeviceShare: types.DeviceShare{ID: id, Exclusive: true}}
	}
	return out
}

// holding is one live container's devices.
type holding struct {
	podUID    string
	container string // its name in the pod
	what      string // container ID or the pending claim, for logs
	devices   []kubeinterface.HeldDevice
	// dra are the devices held whole through DRA claims, of other
	// drivers or kubegpu's.
	dra []string
}

// Claim checks c against what live containers of other pods hold, and, if
// it fits, keeps it as pending. The caller calls release once the
// container's CreateContainer call has been answered by the runtime
// (created, the container is listed from then on; failed, nothing holds
// the devices) or refused before reaching it; release may be called more
// than once, from any goroutine. The error wraps ErrConflict (saying which
// device, not whose pod) or ErrUnavailable.
func (l *Ledger) Claim(ctx context.Context, c Claim) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, err := l.read(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.fits(ctx, c, held); err != nil {
		return nil, err
	}
	l.seq++
	seq := l.seq
	l.pending[seq] = pending{claim: c, key: claimKey(c.PodUID, c.Container, c.Attempt), until: l.opts.Now().Add(l.opts.PendingTTL)}
	return func() { l.release(seq) }, nil
}

// release drops the pending claim numbered seq, if it is still there.
func (l *Ledger) release(seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, seq)
}

// Held returns what live containers and pending claims hold, per device ID:
// for the shim's start-up log and for tests.
func (l *Ledger) Held(ctx context.Context) (map[string][]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held, err := l.read(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, h := range held {
		for _, d := range h.devices {
			if !slices.Contains(h.dra, d.ID) { // a claim's whole GPU: among dra
				out[d.ID] = append(out[d.ID], h.podUID)
			}
		}
		for _, id := range h.dra {
			out[id] = append(out[id], h.podUID)
		}
	}
	return out, nil
}

// read lists the live containers in the ledger and merges the pending
// claims, dropping those whose container is listed, whose pod's sandbox
// is not ready, or that expired. Called with mu held.
func (l *Ledger) read(ctx context.Context) ([]holding, error) {
	listCtx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	list, err := l.opts.Runtime.ListContainers(listCtx, &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{kubeinterface.LabelContainerLedger: kubeinterface.LedgerVersion}})
	if err != nil {
		return nil, fmt.Errorf("%w: list containers: %w", ErrUnavailable, err)
	}
	logger := klog.FromContext(ctx)
	var held []holding
	listed := make(map[string]bool, len(list))
	for _, c := range list {
		uid := c.GetLabels()[kubeinterface.LabelContainerPodUID]
		listed[claimKey(uid, c.GetMetadata().GetName(), c.GetMetadata().GetAttempt())] = true
		if c.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		devices, err := kubeinterface.DecodeHeld(c.GetAnnotations()[kubeinterface.AnnotationContainerHeld])
		var dra []kubeinterface.HeldDevice
		if v, ok := c.GetAnnotations()[kubeinterface.AnnotationContainerDRAHeld]; ok && err == nil {
			dra, err = kubeinterface.DecodeHeld(v)
		}
		if err != nil || uid == "" {
			// Only the shim writes these; the runtime's store was changed
			// behind its back.
			logger.Error(err, "Container in the device ledger with unreadable holdings; not counted", "containerID", c.GetId(), "podUID", uid)
			continue
		}
		h := holding{podUID: uid, container: c.GetMetadata().GetName(), what: "container " + c.GetId(), devices: devices}
		for _, d := range dra {
			h.dra = append(h.dra, d.ID)
		}
		held = append(held, h)
	}
	var live map[string]bool
	if len(l.pending) > 0 {
		if live, err = l.opts.Runtime.LivePods(listCtx); err != nil {
			return nil, fmt.Errorf("%w: list pod sandboxes: %w", ErrUnavailable, err)
		}
	}
	now := l.opts.Now()
	for seq, p := range l.pending {
		// Listed in any state, the container holds its devices itself
		// (or, exited, nothing): its claims are settled.
		if listed[p.key] || now.After(p.until) || !live[p.claim.PodUID] {
			delete(l.pending, seq)
			continue
		}
		held = append(held, holding{podUID: p.claim.PodUID, container: p.claim.Container, what: "pending " + p.key, devices: p.claim.held(), dra: p.claim.DRA})
	}
	return held, nil
}

// fits checks c against the holdings of other pods. A kubegpu claim's
// whole GPUs are held as other DRA drivers' claims' are (c.DRA and the
// holdings' dra), shared with the other pods of the claim only; its slices
// count as an allocation's, and one container at a time holds a claim's
// slices (each container's limits are its own: two would hold the slice
// twice while the claim counts once). c's own shares of one device are
// summed.
func (l *Ledger) fits(ctx context.Context, c Claim, held []holding) error {
	if err := oneHolderOfSlices(ctx, c, held); err != nil {
		return err
	}
	type use struct {
		exclusive []string // holders
		memoryMiB int64
		compute   int
		holders   []string
		// kubegpu counts the holdings through kubegpu, dra those
		// through DRA claims.
		kubegpu, dra int
	}
	uses := map[string]*use{}
	for _, h := range held {
		if h.podUID == c.PodUID {
			continue
		}
		for _, d := range h.devices {
			if d.Claim != "" && d.Exclusive && slices.Contains(h.dra, d.ID) {
				continue // counted among the holding's dra
			}
			u := uses[d.ID]
			if u == nil {
				u = &use{}
				uses[d.ID] = u
			}
			u.holders = append(u.holders, h.what)
			if d.Claim != "" && d.Exclusive {
				u.dra++ // a claim's whole GPU missing from dra-held: held through DRA all the same
				continue
			}
			if d.Exclusive {
				u.exclusive = append(u.exclusive, h.what)
			}
			u.memoryMiB += d.MemoryMiB
			u.compute += d.ComputePercent
			u.kubegpu++
		}
		for _, id := range h.dra {
			u := uses[id]
			if u == nil {
				u = &use{}
				uses[id] = u
			}
			u.dra++
			u.holders = append(u.holders, h.what)
		}
	}
	// c's own shares, summed per device, in the order first named.
	var ids []string
	want := map[string]*types.DeviceShare{}
	for _, d := range c.held() {
		if d.Claim != "" && d.Exclusive {
			continue // among c.DRA
		}
		w := want[d.ID]
		if w == nil {
			w = &types.DeviceShare{ID: d.ID}
			want[d.ID] = w
			ids = append(ids, d.ID)
		}
		w.Exclusive = w.Exclusive || d.Exclusive
		w.MemoryMiB += d.MemoryMiB
		w.ComputePercent += d.ComputePercent
	}
	var reasons []string
	var holders []string
	for _, id := range ids {
		d := want[id]
		u := uses[id]
		if u == nil {
			u = &use{}
		}
		dev, ok := l.opts.Capacity(id)
		switch {
		case u.dra > 0:
			reasons = append(reasons, fmt.Sprintf("%s is held by another pod's container through a DRA claim", id))
		case len(u.exclusive) > 0:
			reasons = append(reasons, fmt.Sprintf("%s is held whole by another pod's container", id))
		case d.Exclusive && u.kubegpu > 0:
			reasons = append(reasons, fmt.Sprintf("%s is wanted whole but slices of it are held by other pods' containers", id))
		case d.Exclusive:
			continue
		case u.compute+d.ComputePercent > types.MaxComputePercent:
			reasons = append(reasons, fmt.Sprintf("%s: %d%% of compute is held by other pods' containers, %d%% more is over %d%%", id, u.compute, d.ComputePercent, types.MaxComputePercent))
		case ok && dev.MemoryMiB > 0 && u.memoryMiB+d.MemoryMiB > dev.MemoryMiB:
			reasons = append(reasons, fmt.Sprintf("%s: %d MiB of memory is held by other pods' containers, %d MiB more is over its %d MiB", id, u.memoryMiB, d.MemoryMiB, dev.MemoryMiB))
		default:
			continue
		}
		holders = append(holders, u.holders...)
	}
	for _, id := range c.DRA {
		if u := uses[id]; u != nil && u.kubegpu > 0 {
			reasons = append(reasons, fmt.Sprintf("%s, which the pod's DRA claim holds, is held by another pod's container through kubegpu", id))
			holders = append(holders, u.holders...)
		}
	}
	if len(reasons) == 0 {
		return nil
	}
	sort.Strings(holders)
	holders = slices.Compact(holders)
	klog.FromContext(ctx).Info("Device ledger refused a container", "pod", c.Pod, "podUID", c.PodUID, "container", c.Container,
		"reasons", reasons, "holders", holders)
	return fmt.Errorf("%w: %s", ErrConflict, strings.Join(reasons, "; "))
}

// oneHolderOfSlices refuses c when a slice of one of its claims' requests
// is held by another container, of any pod: a claim's slice serves one
// container at a time. Another attempt of the same container is the same
// holder (kubelet runs one attempt at a time; one created and never
// started uses no GPU).
func oneHolderOfSlices(ctx context.Context, c Claim, held []holding) error {
	type request struct{ claim, name string }
	mine := map[request]bool{}
	for _, d := range c.ClaimDevices {
		if !d.Exclusive {
			mine[request{d.Claim, d.Request}] = true
		}
	}
	if len(mine) == 0 {
		return nil
	}
	for _, h := range held {
		if h.podUID == c.PodUID && h.container == c.Container {
			continue
		}
		for _, d := range h.devices {
			if d.Claim != "" && !d.Exclusive && mine[request{d.Claim, d.Request}] {
				klog.FromContext(ctx).Info("Device ledger refused a container", "pod", c.Pod, "podUID", c.PodUID, "container", c.Container,
					"claim", d.Claim, "request", d.Request, "holder", h.what)
				return fmt.Errorf("%w: the slice of ResourceClaim %s (request %s) is held by another container: a claim's slice serves one container at a time",
					ErrConflict, d.Claim, d.Request)
			}
		}
	}
	return nil
}
