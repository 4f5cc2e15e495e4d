package capacity

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

func testCache(t *testing.T) *devicecache.Cache {
	t.Helper()
	c := devicecache.New(devicecache.Config{Engine: cachetest.Engine(t), Keys: kubeinterface.NewKeySet(cachetest.Key(t)), Staleness: time.Hour})
	for _, n := range []struct{ name, preset string }{{"dgx", "dgx1"}, {"t4", "t4x4"}, {"down", "t4x4"}} {
		node := cachetest.Node(t, n.name, n.preset)
		if n.name == "down" {
			node.Status.Conditions[0].Status = corev1.ConditionFalse
		}
		c.UpdateNode(klog.Background(), node)
		c.UpdateLease(cachetest.Lease(n.name, time.Now()), false)
	}
	return c
}

// TestCompute: the live nodes' GPUs by model, each counted once, as
// idle, full or stranded; a node not Ready is not counted.
func TestCompute(t *testing.T) {
	c := testCache(t)
	for _, p := range []struct {
		name        string
		node        string
		count, core int64
	}{{"quad", "dgx", 4, 0}, {"slice", "t4", 1, 30}} {
		pod := cachetest.GPUPod(p.name, p.count, p.core, time.Now())
		r := cachetest.WholeRequest(t, c.Engine(), int(p.count))
		if p.core > 0 {
			var err error
			if r, err = c.Engine().NewRequest(mustRequest(t, p.count, p.core), devicescheduler.Host{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Reserve(pod, p.node, r, devicescheduler.Host{}, devicescheduler.Host{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got := Compute(c, time.Now())
	if got.Nodes != 2 || len(got.Models) != 2 {
		t.Fatalf("capacity %+v, want 2 nodes of 2 models", got)
	}
	v100, t4 := got.Models[1], got.Models[0]
	if v100.GPUs != 8 || v100.Full != 4 || v100.Idle != 4 || v100.Resource != "nvidia.com/gpu" {
		t.Errorf("V100s %+v", v100)
	}
	if t4.GPUs != 4 || t4.Stranded != 1 || t4.Idle != 3 || t4.StrandedMiB <= 0 {
		t.Errorf("T4s %+v", t4)
	}
}

// TestPublish: the ConfigMap is written at once when it holds no
// capacity, then only when two computations agree on a change, or when
// what it holds is stale; without the ConfigMap, a clear error.
func TestPublish(t *testing.T) {
	c := testCache(t)
	ctx := context.Background()
	p := &Publisher{Cache: c, Client: fake.NewClientset(), Namespace: "kube-system", Name: kubeinterface.CapacityConfigMap}
	if err := p.Publish(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "capacity.yaml") {
		t.Errorf("without the ConfigMap: %v", err)
	}
	client := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: kubeinterface.CapacityConfigMap}})
	p = &Publisher{Cache: c, Client: client, Namespace: "kube-system", Name: kubeinterface.CapacityConfigMap}
	writes := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "update" {
				n++
			}
		}
		return n
	}
	read := func() kubeinterface.Capacity {
		t.Helper()
		cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, kubeinterface.CapacityConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		capa, err := kubeinterface.DecodeCapacity(cm.Data[kubeinterface.CapacityKey])
		if err != nil {
			t.Fatal(err)
		}
		return capa
	}
	now := time.Now()
	for i := range 3 {
		if err := p.Publish(ctx, now.Add(time.Duration(i)*Interval)); err != nil {
			t.Fatal(err)
		}
	}
	if writes() != 1 || read().Total().GPUs != 12 {
		t.Fatalf("%d writes, capacity %+v; want 1 write of 12 GPUs", writes(), read())
	}
	c.UpdateNode(klog.Background(), cachetest.Node(t, "down", "t4x4")) // Ready again
	if err := p.Publish(ctx, now.Add(3*Interval)); err != nil {
		t.Fatal(err)
	}
	if writes() != 1 {
		t.Error("a change was written before a second computation agreed")
	}
	if err := p.Publish(ctx, now.Add(4*Interval)); err != nil {
		t.Fatal(err)
	}
	if writes() != 2 || read().Nodes != 3 {
		t.Errorf("after a node came back: %d writes, %+v", writes(), read())
	}
	if err := p.Publish(ctx, now.Add(4*Interval+kubeinterface.CapacityRefresh)); err != nil {
		t.Fatal(err)
	}
	if writes() != 3 {
		t.Error("a stale capacity was not written again")
	}
}

func mustRequest(t *testing.T, count, cores int64) types.PodRequest {
	t.Helper()
	req, err := objects.PodRequest(cachetest.GPUPod("x", count, cores, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
