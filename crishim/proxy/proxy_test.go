package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// fakeRuntime is a CRI runtime for unit tests: it records CreateContainer
// requests and answers a few calls.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	mu      sync.Mutex
	created []*runtimeapi.CreateContainerRequest
	// hold, if set, makes CreateContainer of a container named "held"
	// wait until its client gives up.
	hold bool
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.mu.Lock()
	hold := f.hold && req.GetConfig().GetMetadata().GetName() == "held"
	f.mu.Unlock()
	if hold {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	return &runtimeapi.CreateContainerResponse{ContainerId: "c1"}, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	return nil, status.Errorf(codes.NotFound, "container %q not found", req.GetContainerId())
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s runtimeapi.RuntimeService_GetContainerEventsServer) error {
	for _, id := range []string{"a", "b", "c"} {
		if err := s.Send(&runtimeapi.ContainerEventResponse{ContainerId: id}); err != nil {
			return err
		}
	}
	return nil
}

type envModule struct{}

func (envModule) ContainerEdits(_ context.Context, a types.ContainerAllocation) (types.ContainerEdits, error) {
	v := "void"
	if len(a.Devices) > 0 {
		v = a.Devices[0].UUID
	}
	return types.ContainerEdits{Env: []types.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: v}}}, nil
}

// start runs the fake runtime and a proxy in front of it that rewrites
// CreateContainer for node-1 with key, and returns CRI clients of the
// proxy and its metrics.
func start(t *testing.T, key *kubeinterface.Key) (runtimeapi.RuntimeServiceClient, runtimeapi.ImageServiceClient, *fakeRuntime, *metrics.Shim) {
	t.Helper()
	r := &rewrite.Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key), Modules: func() []rewrite.Module {
		return []rewrite.Module{{Name: "sim", Plugin: envModule{}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}}}
	}}
	tp := startProxy(t, CreateContainer(Devices{Rewriter: r}))
	return runtimeapi.NewRuntimeServiceClient(tp.conn), runtimeapi.NewImageServiceClient(tp.conn), &tp.fake.fakeRuntime, tp.metrics
}

func TestProxyForwardsEveryCall(t *testing.T) {
	rt, img, _, _ := start(t, nil)
	ctx := context.Background()
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.GetRuntimeName() != "fake" {
		t.Fatalf("Version = %v, %v", v, err)
	}
	if _, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "x"}); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `container "x" not found`) {
		t.Errorf("ContainerStatus error = %v, want the runtime's NotFound", err)
	}
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a call the runtime does not implement = %v, want its Unimplemented", err)
	}
	imgs, err := img.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil || len(imgs.GetImages()) != 5000 {
		t.Errorf("ListImages: %d images, %v; want the runtime's 5000", len(imgs.GetImages()), err)
	}
	stream, err := rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.GetContainerId())
	}
	if strings.Join(ids, ",") != "a,b,c" {
		t.Errorf("GetContainerEvents streamed %v, want a,b,c", ids)
	}
}

func TestProxyRewritesCreateContainer(t *testing.T) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	rt, _, fake, m := start(t, key)
	ctx := context.Background()
	allocation := func(pod kubeinterface.PodRef, node, device string) string {
		signed, err := key.Sign(kubeinterface.Allocation{Pod: pod,
			PodAllocation: types.PodAllocation{Node: node, Containers: []types.ContainerAllocation{{Name: "main",
				Devices: []types.DeviceShare{{ID: device, UUID: "GPU-0", Exclusive: true}}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		value, err := kubeinterface.EncodeAllocation(signed)
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
	self := kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-1"}
	value := allocation(self, "node-1", "gpu0")
	req := func(container string, annotations map[string]string) *runtimeapi.CreateContainerRequest {
		return &runtimeapi.CreateContainerRequest{
			PodSandboxId: "sb",
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: container},
				Envs: []*runtimeapi.KeyValue{{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("all")}}},
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ml", Name: "train", Uid: "uid-1"},
				Annotations: annotations},
		}
	}
	annotated := func(value string) map[string]string {
		return map[string]string{kubeinterface.AnnotationAllocation: value}
	}
	for _, tt := range []struct {
		name, container, want string
		annotations           map[string]string
		code                  codes.Code
		reason                metrics.Reason
	}{
		{name: "allocated", container: "main", annotations: annotated(value), want: "GPU-0"},
		{name: "no allocation", container: "main", want: "void"},
		{name: "sidecar", container: "sidecar", annotations: annotated(value), want: "void"},
		{name: "forged", container: "main", annotations: annotated(strings.Replace(value, `"uid":"uid-1"`, `"uid":"uid-2"`, 1)),
			code: codes.PermissionDenied, reason: metrics.ReasonBadSignature},
		{name: "malformed", container: "main", annotations: annotated("{}"), code: codes.FailedPrecondition, reason: metrics.ReasonInvalidAllocation},
		{name: "another pod's", container: "main", annotations: annotated(allocation(kubeinterface.PodRef{Namespace: "ml", Name: "train", UID: "uid-0"}, "node-1", "gpu0")),
			code: codes.PermissionDenied, reason: metrics.ReasonOtherPod},
		{name: "another node's", container: "main", annotations: annotated(allocation(self, "node-2", "gpu0")), code: codes.PermissionDenied, reason: metrics.ReasonOtherNode},
		{name: "device not on the node", container: "main", annotations: annotated(allocation(self, "node-1", "gpu7")), code: codes.FailedPrecondition, reason: metrics.ReasonUnknownDevice},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.created = nil
			fake.mu.Unlock()
			result := "rewritten"
			if tt.code != codes.OK {
				result = tt.code.String()
			}
			counted, timed, refused := m.CreateContainer.With(result).Value(), m.RewriteDuration.With(result).Count(), m.Refusals.With(string(tt.reason)).Value()
			_, err := rt.CreateContainer(ctx, req(tt.container, tt.annotations))
			// The call's result, its time in the shim and, for a refusal,
			// why: counted once each. A refusal is counted before it is
			// sent; a rewritten call after its request reached the runtime,
			// which may answer first.
			for deadline := time.Now().Add(5 * time.Second); m.CreateContainer.With(result).Value() == counted && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if got := m.CreateContainer.With(result).Value() - counted; got != 1 {
				t.Errorf("create_container_total{result=%q} went up by %d, want 1", result, got)
			}
			if got := m.RewriteDuration.With(result).Count() - timed; got != 1 {
				t.Errorf("%d durations observed for result %q, want 1", got, result)
			}
			if tt.code != codes.OK {
				if got := m.Refusals.With(string(tt.reason)).Value() - refused; got != 1 {
					t.Errorf("refusals_total{reason=%q} went up by %d, want 1", tt.reason, got)
				}
				if status.Code(err) != tt.code || !strings.Contains(err.Error(), "kubegpu-crishim: ") {
					t.Fatalf("CreateContainer error = %v, want %v", err, tt.code)
				}
				if len(fake.created) != 0 {
					t.Error("a refused CreateContainer reached the runtime")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var visible []string
			for _, kv := range fake.created[0].GetConfig().GetEnvs() {
				if kv.GetKey() == "NVIDIA_VISIBLE_DEVICES" {
					visible = append(visible, string(kv.GetValue()))
				} else if len(kv.GetValue()) > 0 {
					t.Errorf("runtime got %s=%s; the node sets only NVIDIA_VISIBLE_DEVICES and empties the other selection variables", kv.GetKey(), kv.GetValue())
				}
			}
			if len(visible) != 1 || visible[0] != tt.want {
				t.Errorf("runtime got NVIDIA_VISIBLE_DEVICES %q, want %s only", visible, tt.want)
			}
		})
	}
}

func TestListen(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := Listen(live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Listen(live); err == nil || !strings.Contains(err.Error(), "something already serves there") {
		t.Errorf("Listen on a live socket: %v", err)
	}
	// A stale socket (its server gone) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	sl, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	sl.(*net.UnixListener).SetUnlinkOnClose(false)
	sl.Close()
	l2, err := Listen(stale)
	if err != nil {
		t.Fatalf("Listen on a stale socket: %v", err)
	}
	// Only root (the owner) may talk CRI to the shim.
	if fi, err := os.Stat(stale); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	l2.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen on a regular file: %v", err)
	}
}
