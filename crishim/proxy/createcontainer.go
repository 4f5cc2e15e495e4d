package proxy

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/rewrite"
)

// CreateContainer returns the interceptor that gives a container exactly
// its allocated devices (see package rewrite). Refusals become gRPC errors
// that kubelet shows in the pod's events: PermissionDenied for an
// allocation not valid here, FailedPrecondition for one that cannot be
// applied.
func CreateContainer(r *rewrite.Rewriter) Interceptor {
	return func(ctx context.Context, payload []byte) ([]byte, error) {
		var req runtimeapi.CreateContainerRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "kubegpu-crishim: decode CreateContainerRequest: %v", err)
		}
		name := req.GetConfig().GetMetadata().GetName()
		alloc, err := r.ContainerAllocation(req.GetSandboxConfig(), name)
		if err != nil {
			return nil, toStatus(err)
		}
		edits, err := r.Edits(ctx, alloc)
		if err != nil {
			return nil, toStatus(err)
		}
		if req.Config == nil {
			req.Config = &runtimeapi.ContainerConfig{}
		}
		rewrite.Apply(req.Config, edits)
		md := req.GetSandboxConfig().GetMetadata()
		klog.FromContext(ctx).V(2).Info("Container devices", "pod", klog.KRef(md.GetNamespace(), md.GetName()),
			"container", name, "devices", len(alloc.Devices), "edits", edits)
		return proto.Marshal(&req)
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
