package proxy

import (
	"context"
	"errors"
	"maps"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/ledger"
	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
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
}

// ErrPrivileged is wrapped when a privileged container outside the
// allowlist has an allocation: privileged containers see every host
// device, so they get GPUs only where the operator allowed it.
var ErrPrivileged = errors.New("privileged containers get GPUs only in pods on the node's GPU allowlist")

// CreateContainer returns the interceptor that gives a container exactly
// its allocated devices: it removes every GPU device node, mount, CDI
// device and NVIDIA selection variable the config brings (rewrite.Strip,
// rewrite.Baseline), masks the host's GPU device nodes in privileged
// containers, adds the allocation's edits, and checks the devices against
// the ledger. Pods on the allowlist keep what they ask for. Refusals
// become gRPC errors that kubelet shows in the pod's events:
// PermissionDenied for an allocation not valid here, FailedPrecondition
// for one that cannot be applied (or a privileged container with GPUs),
// ResourceExhausted for devices another pod holds, Unavailable when the
// ledger cannot be read.
func CreateContainer(d Devices) Interceptor {
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		var req runtimeapi.CreateContainerRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "kubegpu-crishim: decode CreateContainerRequest: %v", err)
		}
		if req.Config == nil {
			req.Config = &runtimeapi.ContainerConfig{}
		}
		cfg, sb := req.Config, req.GetSandboxConfig()
		md := sb.GetMetadata()
		name := cfg.GetMetadata().GetName()
		logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(md.GetNamespace(), md.GetName()), "container", name)
		// Only the shim puts containers in the ledger.
		dropLedgerKeys(cfg)

		exempt, allowed := d.Allowlist.Match(sb)
		if allowed {
			if _, ok := sb.GetAnnotations()[kubeinterface.AnnotationAllocation]; !ok {
				logger.Info("Container on the GPU allowlist keeps the devices it asks for", "entry", exempt)
				d.Metrics.Allowlisted.With(md.GetNamespace()).Inc()
				return proto.Marshal(&req)
			}
		}
		alloc, err := d.Rewriter.ContainerAllocation(sb, name)
		if err != nil {
			return nil, toStatus(err)
		}
		privileged := rewrite.Privileged(cfg)
		if privileged && !allowed && len(alloc.Devices) > 0 {
			return nil, status.Errorf(codes.FailedPrecondition, "kubegpu-crishim: container %q: %v", name, ErrPrivileged)
		}
		edits, err := d.Rewriter.Edits(ctx, md.GetUid(), alloc)
		if err != nil {
			return nil, toStatus(err)
		}
		if !allowed {
			if stripped := rewrite.Strip(cfg); !stripped.Empty() {
				logger.Info("Removed GPU access the container brought itself", "removed", stripped)
				d.Metrics.Stripped.Inc()
			}
			if privileged && d.HostGPUNodes != nil {
				cfg.Mounts = append(cfg.Mounts, rewrite.Masks(cfg, d.HostGPUNodes())...)
			}
		}
		rewrite.Apply(cfg, edits)
		if len(alloc.Devices) > 0 && d.Ledger != nil {
			c := ledger.Claim{PodUID: md.GetUid(), Pod: md.GetNamespace() + "/" + md.GetName(), Container: name,
				Attempt: cfg.GetMetadata().GetAttempt(), Devices: alloc.Devices}
			labels, annotations, err := ledger.Labels(c)
			if err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "kubegpu-crishim: container %q: %v", name, err)
			}
			if err := d.Ledger.Claim(klog.NewContext(ctx, logger), c); err != nil {
				if errors.Is(err, ledger.ErrConflict) {
					d.Metrics.LedgerRefusals.Inc()
					return nil, status.Errorf(codes.ResourceExhausted, "kubegpu-crishim: container %q: %v", name, err)
				}
				return nil, status.Errorf(codes.Unavailable, "kubegpu-crishim: container %q: %v", name, err)
			}
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			if cfg.Annotations == nil {
				cfg.Annotations = map[string]string{}
			}
			maps.Copy(cfg.Labels, labels)
			maps.Copy(cfg.Annotations, annotations)
		}
		logger.V(2).Info("Container devices", "devices", len(alloc.Devices), "privileged", privileged, "allowlisted", allowed, "edits", edits)
		return proto.Marshal(&req)
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

func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, rewrite.ErrForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, rewrite.ErrInvalid):
		code = codes.FailedPrecondition
	}
	return status.Error(code, "kubegpu-crishim: "+err.Error())
}
