package advertiser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// TestClientRequests: the REST client sends what the API server expects
// (paths, verbs, JSON) and returns its errors decoded.
func TestClientRequests(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("Accept"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/nodes/n1" && r.Method == http.MethodGet:
			_, _ = io.WriteString(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","uid":"u-1",
				"annotations":{"kubegpu.io/inventory":"inv","other":"x"}},
				"status":{"capacity":{"cpu":"8","nvidia.com/gpu":"800"},"allocatable":{"nvidia.com/gpu":"800","kubegpu.io/gpu-cores":"800"},
				"conditions":[{"type":"Ready","status":"True"},{"type":"kubegpu.io/DevicesReady","status":"False","reason":"ModuleLoadFailed","message":"nvidia.so: bad","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`)
		case r.URL.Path == "/api/v1/nodes/gone":
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"gone\" is forbidden: RBAC says no","reason":"Forbidden","code":403}`)
		default:
			if r.Method != http.MethodGet && !json.Valid(body) {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			_, _ = w.Write(body)
		}
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, err := c.GetNode(ctx, "n1")
	if err != nil || n.UID != "u-1" || !n.HasInventory || n.Inventory != "inv" {
		t.Errorf("GetNode = %+v, %v", n, err)
	}
	if err == nil && (len(n.Capacity) != 1 || len(n.Allocatable) != 2) {
		t.Errorf("GetNode kept capacity %v and allocatable %v, want only kubegpu's resources", n.Capacity, n.Allocatable)
	}
	if want := (Condition{Status: "False", Reason: "ModuleLoadFailed", Message: "nvidia.so: bad"}); err == nil && (n.DevicesReady == nil || *n.DevicesReady != want) {
		t.Errorf("GetNode condition %+v, want %+v", n.DevicesReady, want)
	}
	if _, err := c.GetNode(ctx, "gone"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "RBAC says no") {
		t.Errorf("GetNode of a forbidden node: %v, want the API server's message", err)
	}
	if err := c.PatchNode(ctx, "n1", ktypes.MergePatchType, []byte(`{"status":{}}`), "status"); err != nil {
		t.Error(err)
	}
	if err := patchCondition(ctx, c, "n1", kubeinterface.ConditionDevicesReady, Condition{Status: "False", Reason: "ModuleLoadFailed", Message: "nvidia.so: bad"}, time.Unix(0, 0), true); err != nil {
		t.Error(err)
	}
	want := []string{
		"GET /api/v1/nodes/n1?resourceVersion=0  application/json",
		"GET /api/v1/nodes/gone?resourceVersion=0  application/json",
		"PATCH /api/v1/nodes/n1/status application/merge-patch+json application/json",
		"PATCH /api/v1/nodes/n1/status application/strategic-merge-patch+json application/json",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var schemaNodes = schema.GroupResource{Resource: "nodes"}

// fakeNode is a Node in memory, patched as the API server would.
type fakeNode struct {
	mu      sync.Mutex
	node    *Node
	patches int
	fail    error
	// transitions counts the bytes of lastTransitionTime written.
	transitions int
}

func (f *fakeNode) GetNode(_ context.Context, name string) (*Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	if f.node == nil {
		return nil, apierrors.NewNotFound(schemaNodes, name)
	}
	c := *f.node
	return &c, nil
}

func (f *fakeNode) PatchNode(_ context.Context, _ string, pt ktypes.PatchType, patch []byte, subresource ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches++
	var p struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Status struct {
			Capacity    map[string]*resource.Quantity `json:"capacity"`
			Allocatable map[string]*resource.Quantity `json:"allocatable"`
			Conditions  []map[string]string           `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return err
	}
	if len(p.Status.Conditions) > 0 && p.Status.Conditions[0]["$patch"] == "delete" {
		// Withdraw: the conditions and the capacity go.
		f.node.DevicesReady = nil
		for name := range p.Status.Capacity {
			delete(f.node.Capacity, name)
			delete(f.node.Allocatable, name)
		}
		return nil
	}
	if len(p.Status.Conditions) > 0 {
		// Only a strategic merge patch merges conditions by type.
		if pt != ktypes.StrategicMergePatchType || len(p.Status.Conditions) != 1 || len(subresource) == 0 {
			return fmt.Errorf("conditions patched with %s, %d of them, subresource %v", pt, len(p.Status.Conditions), subresource)
		}
		c := p.Status.Conditions[0]
		if c["type"] != kubeinterface.ConditionDevicesReady || c["lastHeartbeatTime"] == "" {
			return fmt.Errorf("condition %v", c)
		}
		f.transitions += len(c["lastTransitionTime"])
		f.node.DevicesReady = &Condition{Status: c["status"], Reason: c["reason"], Message: c["message"]}
		return nil
	}
	if pt != ktypes.MergePatchType {
		return fmt.Errorf("patch type %s", pt)
	}
	if len(subresource) == 0 {
		f.node.Inventory, f.node.HasInventory = p.Metadata.Annotations[kubeinterface.AnnotationInventory], true
	} else {
		// A JSON merge patch: null removes.
		merge := func(into ResourceList, patch map[string]*resource.Quantity) ResourceList {
			if into == nil {
				into = ResourceList{}
			}
			for name, q := range patch {
				if q == nil {
					delete(into, name)
				} else {
					into[name] = *q
				}
			}
			return into
		}
		f.node.Capacity, f.node.Allocatable = merge(f.node.Capacity, p.Status.Capacity), merge(f.node.Allocatable, p.Status.Allocatable)
	}
	return nil
}

// TestAdvertiserConverges: the advertiser writes only what the Node lacks,
// and restores an inventory or capacity that someone else changed.
func TestAdvertiserConverges(t *testing.T) {
	ctx := context.Background()
	inv := types.Inventory{Devices: []types.Device{{ID: "gpu0", UUID: "GPU-0", Model: "T4", MemoryMiB: 15360, Health: types.Healthy}}}
	f := &fakeNode{}
	a, err := New(Options{Node: "n1", Client: f, Discover: func(context.Context) (types.Inventory, error) { return inv, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Once(ctx); err == nil || !strings.Contains(err.Error(), "not registered yet") {
		t.Fatalf("before the node exists: %v", err)
	}
	f.node = &Node{UID: "u-1"}
	if err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if f.patches != 2 {
		t.Fatalf("first round patched %d times, want 2 (inventory, capacity)", f.patches)
	}
	if q := f.node.Capacity[kubeinterface.ResourceGPU]; q.Value() != 100 {
		t.Errorf("nvidia.com/gpu capacity %s, want 100", q.String())
	}
	if err := a.Once(ctx); err != nil || f.patches != 2 {
		t.Fatalf("an unchanged node was patched again (%d patches, %v)", f.patches, err)
	}
	// Something resets the capacity (kubelet does on some restarts) and
	// removes the annotation: both come back in one round.
	f.node.Capacity = ResourceList{kubeinterface.ResourceGPU: resource.MustParse("0")}
	f.node.HasInventory, f.node.Inventory = false, ""
	if err := a.Once(ctx); err != nil || f.patches != 4 {
		t.Fatalf("restore: %d patches, %v; want 4", f.patches, err)
	}
	if a.opts.Metrics.Restores.Value() != 1 {
		t.Errorf("restores = %d, want 1", a.opts.Metrics.Restores.Value())
	}
	if q := f.node.Capacity[kubeinterface.ResourceGPU]; q.Value() != 100 || !f.node.HasInventory {
		t.Errorf("after the round: capacity %s, inventory %v", q.String(), f.node.HasInventory)
	}
	f.fail = errors.New("connection refused")
	if err := a.Once(ctx); err == nil || a.opts.Metrics.Syncs.With("error").Value() != 2 {
		t.Errorf("API down: %v, %d failed syncs", err, a.opts.Metrics.Syncs.With("error").Value())
	}
}

// TestAdvertiserKeepsCondition: the DevicesReady condition is written
// once, rewritten when it changes (its transition time only when its
// status does) or when someone else changed it, and its message is cut to
// a bound.
func TestAdvertiserKeepsCondition(t *testing.T) {
	ctx := context.Background()
	f := &fakeNode{node: &Node{UID: "u-1"}}
	discover := func(context.Context) (types.Inventory, error) { return types.Inventory{}, nil }
	failed := Condition{Status: "False", Reason: kubeinterface.ReasonModuleLoadFailed, Message: "nvidia.so: " + strings.Repeat("x", 5000)}
	a, err := New(Options{Node: "n1", Client: f, Discover: discover, Condition: &failed})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Once(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.node.DevicesReady
	if got == nil || got.Status != "False" || got.Reason != kubeinterface.ReasonModuleLoadFailed ||
		len(got.Message) > maxConditionMessage || !strings.HasPrefix(got.Message, "nvidia.so: xxx") || !strings.HasSuffix(got.Message, "…") {
		t.Fatalf("condition %+v", got)
	}
	if f.transitions == 0 {
		t.Error("a new condition has no lastTransitionTime")
	}
	patches := f.patches
	if err := a.Once(ctx); err != nil || f.patches != patches {
		t.Fatalf("an unchanged condition was written again (%d patches, %v)", f.patches-patches, err)
	}
	// Someone else changes it: restored in one round.
	f.node.DevicesReady = &Condition{Status: "True", Reason: "Fine"}
	if err := a.Once(ctx); err != nil || f.node.DevicesReady.Status != "False" {
		t.Fatalf("changed condition not restored: %+v, %v", f.node.DevicesReady, err)
	}
	// The same status with another message keeps its transition time.
	transitions := f.transitions
	a2, _ := New(Options{Node: "n1", Client: f, Discover: discover, Condition: &Condition{Status: "False", Reason: kubeinterface.ReasonModuleLoadFailed, Message: "other"}})
	if err := a2.Once(ctx); err != nil || f.node.DevicesReady.Message != "other" || f.transitions != transitions {
		t.Errorf("message change: %+v, %v, transition written %v", f.node.DevicesReady, err, f.transitions != transitions)
	}
}

// FuzzDecodeNode: what the advertiser reads of its Node (which anyone with
// the node's credentials can write) never panics, and a decoded Node keeps
// only kubegpu's resources.
func FuzzDecodeNode(f *testing.F) {
	f.Add([]byte(`{"metadata":{"uid":"u","annotations":{"kubegpu.io/inventory":"x"}},"status":{"capacity":{"nvidia.com/gpu":"800","cpu":"8"}}}`))
	f.Add([]byte(`{"status":{"allocatable":{"kubegpu.io/gpu-memory":"1e40"}}}`))
	f.Add([]byte(`{"status":{"capacity":{"nvidia.com/gpu":"-1"}}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"metadata":{"annotations":{"kubegpu.io/inventory":"{\"apiVersion\":\"kubegpu.io/v1\",\"kind\":\"NodeInventory\",\"devices\":[]}"}},"status":{"capacity":{"amd.com/gpu":"8","example.com/x":"1"}}}`))
	f.Add([]byte(`{"status":{"conditions":[{"type":"Ready","status":"True"},{"type":"kubegpu.io/DevicesReady","status":"False","reason":"ModuleLoadFailed","message":"m"}]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		n, err := decodeNode(body)
		if err != nil {
			return
		}
		for name := range n.Capacity {
			if !slices.Contains(resourceNames, name) {
				t.Fatalf("kept capacity %q", name)
			}
		}
		_ = n.Capacity.EqualOn(n.Allocatable, Owned(n.Capacity, n.Inventory))
	})
}
