package proxy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/draclaims"
	"github.com/kubegpu/kubegpu/crishim/ledger"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
)

// Devices is what deciding a container's devices takes.
type Devices struct {
	// Rewriter verifies allocations and makes the modules' edits.
	Rewriter *rewrite.Rewriter
	// Allowlist exempts monitoring agents and the like from the guard.
	Allowlist rewrite.Allowlist
	// HostGPUNodes lists the host's GPU device nodes, which privileged
	// containers get masked (rewrite.HostGPUNodes("/dev")). Nil: none.
	HostGPUNodes func() []string
	// Ledger refuses devices other pods' live containers hold. Nil: no
	// ledger (unit tests).
	Ledger *ledger.Ledger
	// Metrics counts exemptions, stripped configs and ledger refusals;
	// optional.
	Metrics *metrics.Shim
	// CDIOff reports whether the runtime is known to ignore CDI devices
	// (containerd 1.7 without enable_cdi). Nil: it is not.
	CDIOff func() bool
	// DRA says what the prepared claims of other DRA drivers hold
	// (draclaims.Guard). Nil: not checked.
	DRA DRAClaims
	// Claims resolves the CDI devices of kubegpu's own ResourceClaims
	// (claimplugin.Store). Nil: none are served.
	Claims ClaimDevices
}

// ClaimDevices resolves the CDI devices kubelet passes for kubegpu's
// ResourceClaims into the devices they stand for; used are the CDI names
// resolved.
type ClaimDevices interface {
	Shares(cdi []string) (shares []kubeinterface.HeldDevice, used []string, err error)
}

// DRAClaims is what CreateContainer asks of the node's DRA claims.
type DRAClaims interface {
	For(ctx context.Context, namespace, name string) (draclaims.Claims, error)
}

// ErrHeldByDRA is wrapped when a prepared ResourceClaim of another DRA
// driver holds a GPU of the container's allocation.
var ErrHeldByDRA = errors.New("a DRA claim holds the GPU")

// ErrCDIOff is wrapped when a container's devices are CDI devices and the
// runtime would drop them.
var ErrCDIOff = errors.New("the container runtime has CDI off (containerd 1.7's enable_cdi = false): the container would get no GPU; enable CDI, or set --plugin-option nvidia.edits=env")

// ErrPrivileged is wrapped when a privileged container outside the
// allowlist has an allocation: privileged containers see every host
// device, so they get GPUs only where the operator allowed it.
var ErrPrivileged = errors.New("privileged containers get GPUs only in pods on the node's GPU allowlist")

// CreateContainer returns the interceptor that gives a container exactly
// its allocated devices: it removes every GPU device node, mount, CDI
// device and NVIDIA selection variable the config brings (rewrite.Strip,
// rewrite.Baseline), masks the host's GPU device nodes in privileged
// containers, adds the allocation's edits, and checks the devices against
// the ledger, whose claim on the devices lasts until the runtime answers
// the call. Pods on the allowlist keep what they ask for. Refusals
// become gRPC errors that kubelet shows in the pod's events:
// PermissionDenied for an allocation not valid here, FailedPrecondition
// for one that cannot be applied (or a privileged container with GPUs),
// ResourceExhausted for devices another pod holds, Unavailable when the
// ledger cannot be read. Each says why (a metrics.Reason) for
// kubegpu_crishim_create_container_refusals_total.
func CreateContainer(d Devices) Interceptor {
	if d.Metrics == nil {
		d.Metrics = metrics.New()
	}
	return func(ctx context.Context, payload []byte) (out []byte, answered func(), err error) {
		var req runtimeapi.CreateContainerRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, nil, &refusal{reason: metrics.ReasonBadRequest,
				st: status.Newf(codes.InvalidArgument, "kubegpu-crishim: decode CreateContainerRequest: %v", err)}
		}
		if req.Config == nil {
			req.Config = &runtimeapi.ContainerConfig{}
		}
		cfg, sb := req.Config, req.GetSandboxConfig()
		md := sb.GetMetadata()
		name := cfg.GetMetadata().GetName()
		logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()), "container", name)
		refuse := func(code codes.Code, reason metrics.Reason, err error) ([]byte, func(), error) {
			return nil, nil, &refusal{reason: reason, st: status.Newf(code, "kubegpu-crishim: container %q: %v", name, err)}
		}
		// Only the shim puts containers in the ledger.
		dropLedgerKeys(cfg)

		exempt, allowed := d.Allowlist.Match(sb)
		if allowed {
			claimCDI := slices.ContainsFunc(cfg.GetCDIDevices(), func(c *runtimeapi.CDIDevice) bool { return strings.HasPrefix(c.GetName(), dra.ClaimCDIKind+"=") })
			if _, ok := sb.GetAnnotations()[kubeinterface.AnnotationAllocation]; !ok && !claimCDI {
				logger.Info("Container on the GPU allowlist keeps the devices it asks for", "entry", exempt)
				d.Metrics.Allowlisted.With(md.GetNamespace()).Inc()
				out, err := proto.Marshal(&req)
				return out, nil, err
			}
		}
		alloc, err := d.Rewriter.ContainerAllocation(sb, name)
		if err != nil {
			return nil, nil, rewriteRefusal(err)
		}
		// The devices of the pod's kubegpu claims that the container
		// uses, which kubelet passes as CDI devices: given as its
		// allocation's are, and held in the ledger (a whole GPU shared
		// with the claim's other pods only; a slice beside other slices).
		var claimShares []kubeinterface.HeldDevice
		if d.Claims != nil && len(cfg.GetCDIDevices()) > 0 {
			names := make([]string, 0, len(cfg.GetCDIDevices()))
			for _, c := range cfg.GetCDIDevices() {
				names = append(names, c.GetName())
			}
			var used []string
			if claimShares, used, err = d.Claims.Shares(names); err != nil {
				return refuse(codes.PermissionDenied, metrics.ReasonInvalidAllocation, err)
			}
			cfg.CDIDevices = slices.DeleteFunc(cfg.CDIDevices, func(c *runtimeapi.CDIDevice) bool { return slices.Contains(used, c.GetName()) })
		}
		privileged := rewrite.Privileged(cfg)
		if privileged && !allowed && len(alloc.Devices)+len(claimShares) > 0 {
			return refuse(codes.FailedPrecondition, metrics.ReasonPrivileged, ErrPrivileged)
		}
		// What DRA claims hold: a GPU of the allocation that another
		// pod's claim holds is refused; the GPUs the pod's own claims
		// hold go into the ledger with the container (so that no kubegpu
		// container gets them meanwhile), and the claims' CDI devices
		// stay. Only containers that may get a device ask.
		var claims draclaims.Claims
		if d.DRA != nil && (len(alloc.Devices) > 0 || len(cfg.GetCDIDevices()) > 0 || rewrite.HasCDIAnnotations(cfg.GetAnnotations())) {
			if claims, err = d.DRA.For(ctx, md.GetNamespace(), md.GetName()); err != nil {
				return refuse(codes.Unavailable, metrics.ReasonDRAUnknown, err)
			}
			for _, s := range alloc.Devices {
				if h, ok := claims.Others[s.ID]; ok {
					return refuse(codes.ResourceExhausted, metrics.ReasonDRAHeld, fmt.Errorf("%w: GPU %s is held by %s", ErrHeldByDRA, s.ID, h))
				}
			}
		}
		// The ledger first: a container refused here starts nothing (no
		// MPS daemon) for devices another pod holds.
		var claimLabels, claimAnnotations map[string]string
		// A claim's whole GPUs are held as DRA claims' are (shared with
		// the claim's other pods); its slices as an allocation's.
		held := slices.Clone(claims.Own)
		for _, s := range claimShares {
			if s.Exclusive {
				held = append(held, s.ID)
			}
		}
		if len(alloc.Devices)+len(claimShares)+len(held) > 0 && d.Ledger != nil {
			c := ledger.Claim{PodUID: md.GetUid(), Pod: md.GetNamespace() + "/" + md.GetName(), Container: name,
				Attempt: cfg.GetMetadata().GetAttempt(), Devices: alloc.Devices, ClaimDevices: claimShares, DRA: held}
			if claimLabels, claimAnnotations, err = ledger.Labels(c); err != nil {
				return refuse(codes.FailedPrecondition, metrics.ReasonInvalidAllocation, err)
			}
			var release func()
			if release, err = d.Ledger.Claim(klog.NewContext(ctx, logger), c); err != nil {
				if errors.Is(err, ledger.ErrConflict) {
					d.Metrics.LedgerRefusals.Inc()
					return refuse(codes.ResourceExhausted, metrics.ReasonDevicesHeld, err)
				}
				return refuse(codes.Unavailable, metrics.ReasonLedgerUnavailable, err)
			}
			// Held while the call is in flight: released when the
			// runtime answers it, or now if it goes no further.
			answered = release
			defer func() {
				if err != nil { // the named result: whatever refused the call below
					release()
				}
			}()
		}
		if len(claimShares) > 0 {
			alloc.Devices = append(slices.Clone(alloc.Devices), kubeinterface.Shares(claimShares)...)
		}
		edits, err := d.Rewriter.Edits(ctx, md.GetUid(), alloc)
		if err != nil {
			return nil, nil, rewriteRefusal(err)
		}
		if len(edits.CDIDevices) > 0 && d.CDIOff != nil && d.CDIOff() {
			return refuse(codes.FailedPrecondition, metrics.ReasonCDIOff, ErrCDIOff)
		}
		if !allowed {
			guarded := d.Rewriter.Guarded()
			stripped := rewrite.Strip(cfg, claims.CDI, guarded)
			// containerd may pass the pod's annotations on to the runtime
			// (pod_annotations), and CDI-aware runtimes read them.
			if sbStripped := rewrite.StripCDIAnnotations(sb.GetAnnotations(), nil); len(sbStripped) > 0 {
				stripped.CDIDevices = append(stripped.CDIDevices, sbStripped...)
			}
			if !stripped.Empty() {
				logger.Info("Removed GPU access the container brought itself", "removed", stripped)
				d.Metrics.Stripped.Inc()
			}
			if privileged {
				var nodes []string
				if d.HostGPUNodes != nil {
					nodes = d.HostGPUNodes()
				}
				for _, g := range guarded {
					nodes = append(nodes, g.ContainerPath)
				}
				cfg.Mounts = append(cfg.Mounts, rewrite.Masks(cfg, nodes)...)
			}
		}
		rewrite.Apply(cfg, edits)
		if claimLabels != nil {
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			if cfg.Annotations == nil {
				cfg.Annotations = map[string]string{}
			}
			maps.Copy(cfg.Labels, claimLabels)
			maps.Copy(cfg.Annotations, claimAnnotations)
		}
		logger.V(2).Info("Container devices", "devices", len(alloc.Devices), "privileged", privileged, "allowlisted", allowed, "edits", edits)
		if out, err = proto.Marshal(&req); err != nil {
			return nil, nil, err
		}
		return out, answered, nil
	}
}

// dropLedgerKeys removes the ledger's labels and annotations from a
// config that brings them.
func dropLedgerKeys(cfg *runtimeapi.ContainerConfig) {
	for _, m := range []map[string]string{cfg.Labels, cfg.Annotations} {
		for k := range m {
			if strings.HasPrefix(k, kubeinterface.Domain) {
				delete(m, k)
			}
		}
	}
}

// refusal is an interceptor's refusal of a call: the gRPC status the
// client gets, and why, for the refusals metric.
type refusal struct {
	reason metrics.Reason
	st     *status.Status
}

func (r *refusal) Error() string { return r.st.Err().Error() }

// GRPCStatus makes status.Convert and status.Code see the refusal's
// status.
func (r *refusal) GRPCStatus() *status.Status { return r.st }

// refusalReason is why an interceptor's err refused a call: ReasonOther
// for an error that does not say.
func refusalReason(err error) metrics.Reason {
	var r *refusal
	if errors.As(err, &r) {
		return r.reason
	}
	return metrics.ReasonOther
}

// rewriteRefusal refuses a container whose allocation the rewrite
// refused: PermissionDenied for an allocation not valid here,
// FailedPrecondition for one that cannot be applied, Internal otherwise.
func rewriteRefusal(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, rewrite.ErrForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, rewrite.ErrInvalid):
		code = codes.FailedPrecondition
	}
	return &refusal{reason: rewriteReason(err), st: status.New(code, "kubegpu-crishim: "+err.Error())}
}

// rewriteReason classifies the rewrite's errors by the sentinels and
// types they wrap. A module's own error comes first: what it wraps is the
// module's business.
func rewriteReason(err error) metrics.Reason {
	var me *rewrite.ModuleError
	switch {
	case errors.As(err, &me):
		return metrics.ReasonModuleError
	case errors.Is(err, kubeinterface.ErrBadSignature):
		return metrics.ReasonBadSignature
	case errors.Is(err, rewrite.ErrOtherPod):
		return metrics.ReasonOtherPod
	case errors.Is(err, rewrite.ErrOtherNode):
		return metrics.ReasonOtherNode
	case errors.Is(err, rewrite.ErrModulesFailed):
		return metrics.ReasonModuleFailed
	case errors.Is(err, rewrite.ErrUnknownDevice):
		return metrics.ReasonUnknownDevice
	case errors.Is(err, rewrite.ErrInvalid):
		return metrics.ReasonInvalidAllocation
	}
	return metrics.ReasonOther
}
