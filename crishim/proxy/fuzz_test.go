package proxy

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// FuzzCreateContainer feeds arbitrary request bytes to the interceptor: it
// never panics, every refusal says why (for the refusals metric), and what
// it forwards is a request whose devices env was set by the node.
func FuzzCreateContainer(f *testing.F) {
	key, err := kubeinterface.NewHMACKey([]byte(strings.Repeat("k", 32)))
	if err != nil {
		f.Fatal(err)
	}
	r := &rewrite.Rewriter{Node: "node-1", Keys: kubeinterface.NewKeySet(key), Modules: func() []rewrite.Module {
		return []rewrite.Module{{Name: "sim", Plugin: envModule{}, Devices: map[string]types.Device{"gpu0": {ID: "gpu0"}}}}
	}}
	intercept := CreateContainer(Devices{Rewriter: r})
	seed, _ := proto.Marshal(&runtimeapi.CreateContainerRequest{
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
			Envs: []*runtimeapi.KeyValue{{Key: "NVIDIA_VISIBLE_DEVICES", Value: []byte("all")}}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Annotations: map[string]string{kubeinterface.AnnotationAllocation: `{"apiVersion":"kubegpu.io/v1"}`}},
	})
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, payload []byte) {
		out, _, err := intercept(context.Background(), payload)
		if err != nil {
			if refusalReason(err) == metrics.ReasonOther {
				t.Fatalf("refusal %v does not say why", err)
			}
			return
		}
		var req runtimeapi.CreateContainerRequest
		if err := proto.Unmarshal(out, &req); err != nil {
			t.Fatalf("forwarded request does not decode: %v", err)
		}
		var visible []string
		for _, kv := range req.GetConfig().GetEnvs() {
			if kv.GetKey() == "NVIDIA_VISIBLE_DEVICES" {
				visible = append(visible, string(kv.GetValue()))
			}
		}
		if len(visible) != 1 {
			t.Fatalf("forwarded NVIDIA_VISIBLE_DEVICES %q, want exactly one value set by the node", visible)
		}
	})
}
