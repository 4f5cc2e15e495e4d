package advertiser

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// fakeSlicesClient is a fake clientset whose ResourceSlices get names and
// resource versions as the API server gives them, and lose their devices'
// taints when dropTaints (an API server with DRADeviceTaints off).
func fakeSlicesClient(dropTaints bool) *fake.Clientset {
	c := fake.NewClientset()
	var mu sync.Mutex
	n := 0
	stamp := func(s *resourceapi.ResourceSlice) {
		rv, _ := strconv.Atoi(s.ResourceVersion)
		s.ResourceVersion = strconv.Itoa(rv + 1)
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%d", s.GenerateName, n)
			n++
		}
		if dropTaints {
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].Taints = nil
			}
		}
	}
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		stamp(a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice))
		return false, nil, nil
	})
	c.PrependReactor("update", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		stamp(a.(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceSlice))
		return false, nil, nil
	})
	return c
}

func twoGPUs() types.Inventory {
	return types.Inventory{Devices: []types.Device{
		{ID: "gpu0", UUID: "GPU-0", Model: "Tesla T4", MemoryMiB: 15360, NUMANode: -1, Health: types.Healthy},
		{ID: "gpu1", UUID: "GPU-1", Model: "Tesla T4", MemoryMiB: 15360, NUMANode: -1, Health: types.Healthy},
	}}
}

// runSlices runs a publisher on client until the test ends.
func runSlices(t *testing.T, client *fake.Clientset, m *metrics.Shim) (*Slices, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := NewSlices(client, "n1", dra.Options{}, m)
	s.syncDelay = 100 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, ctx
}

// pollSlices waits until the stored slices satisfy ok.
func pollSlices(ctx context.Context, t *testing.T, client *fake.Clientset, what string, ok func([]resourceapi.ResourceSlice) bool) {
	t.Helper()
	var items []resourceapi.ResourceSlice
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		items = list.Items
		return ok(items), nil
	}); err != nil {
		t.Fatalf("%s: %v; slices %+v", what, err, items)
	}
}

// TestSlicesFollowTheNode: the slices are owned by the Node the advertiser
// read; a Node registered again (a new UID) gets its own once the garbage
// collector has removed the old Node's.
func TestSlicesFollowTheNode(t *testing.T) {
	client := fakeSlicesClient(false)
	s, ctx := runSlices(t, client, nil)
	ownedBy := func(uid string) func([]resourceapi.ResourceSlice) bool {
		return func(items []resourceapi.ResourceSlice) bool {
			for _, it := range items {
				if len(it.OwnerReferences) != 1 || string(it.OwnerReferences[0].UID) != uid || len(it.Spec.Devices) != 2 ||
					len(it.Spec.Devices[0].Taints) == 0 {
					return false
				}
			}
			return len(items) == 1
		}
	}
	s.Update(ctx, twoGPUs(), "uid-1")
	pollSlices(ctx, t, client, "first Node", ownedBy("uid-1"))
	// The Node is deleted and registered again: the garbage collector
	// deletes the slices of the old Node whenever it finds them.
	s.Update(ctx, twoGPUs(), "uid-2")
	pollSlices(ctx, t, client, "Node registered again", func(items []resourceapi.ResourceSlice) bool {
		for _, it := range items {
			if len(it.OwnerReferences) == 1 && it.OwnerReferences[0].UID == "uid-1" {
				_ = client.ResourceV1().ResourceSlices().Delete(ctx, it.Name, metav1.DeleteOptions{})
			}
		}
		return ownedBy("uid-2")(items)
	})
}

// TestSlicesWithdrawnWithoutTaints: an API server that drops the devices'
// taints gets no slices: they would let DRA's allocator hand out GPUs that
// kubegpu allocates.
func TestSlicesWithdrawnWithoutTaints(t *testing.T) {
	client := fakeSlicesClient(true)
	m := metrics.New()
	s, ctx := runSlices(t, client, m)
	s.Update(ctx, twoGPUs(), "uid-1")
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.withdrawn, nil
	}); err != nil {
		t.Fatalf("the dropped taints were not noticed: %v", err)
	}
	pollSlices(ctx, t, client, "withdrawn", func(items []resourceapi.ResourceSlice) bool { return len(items) == 0 })
	if m.SliceErrors.Value() == 0 {
		t.Error("the dropped taints were not counted")
	}
	// A later discovery does not bring them back: Run handles it and
	// hands the controller nothing new.
	inv := twoGPUs()
	inv.Devices[1].Health = types.Unhealthy
	handled(ctx, t, s, func() { s.Update(ctx, inv, "uid-1") })
	s.mu.Lock()
	pushed := s.pushed
	s.mu.Unlock()
	if pushed != "withdrawn" {
		t.Errorf("after a new discovery the controller was handed %q, want nothing (withdrawn)", pushed)
	}
}

// handled runs change and waits until Run has handled it.
func handled(ctx context.Context, t *testing.T, s *Slices, change func()) {
	t.Helper()
	r0 := s.rounds.Load()
	change()
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return s.rounds.Load() > r0, nil
	}); err != nil {
		t.Fatalf("Run did not handle the change: %v", err)
	}
}

// TestSlicesStopWhileTheNodeIsGone: without a Node the controller stops,
// so that it does not publish again what the garbage collector removes.
func TestSlicesStopWhileTheNodeIsGone(t *testing.T) {
	client := fakeSlicesClient(false)
	s, ctx := runSlices(t, client, nil)
	s.Update(ctx, twoGPUs(), "uid-1")
	pollSlices(ctx, t, client, "published", func(items []resourceapi.ResourceSlice) bool { return len(items) == 1 })
	handled(ctx, t, s, s.NodeGone)
	s.mu.Lock()
	running := s.running
	s.mu.Unlock()
	if running {
		t.Fatal("the controller still runs without a Node")
	}
	// The garbage collector removes the slices; nothing publishes them
	// again. The same Node back: they are.
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range list.Items {
		if err := client.ResourceV1().ResourceSlices().Delete(ctx, it.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.Update(ctx, twoGPUs(), "uid-1")
	pollSlices(ctx, t, client, "published again", func(items []resourceapi.ResourceSlice) bool { return len(items) == 1 })
}
