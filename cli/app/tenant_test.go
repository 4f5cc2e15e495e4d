package app

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache/cachetest"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// tenantCluster has pods of namespace ns on node-0 and node-1, a pod of
// another namespace on node-1, a pending pod and the published capacity.
func tenantCluster(t *testing.T) (*uiCluster, *fake.Clientset) {
	t.Helper()
	c := newUICluster(t, "dgx1", "dgx1")
	mine := c.bind(t, "mine", "node-0", 2)
	other := c.bind(t, "other", "node-1", 4)
	other.Namespace = "elsewhere"
	forged := c.bind(t, "forged", "node-1", 1)
	forged.Annotations[kubeinterface.AnnotationAllocation] = other.Annotations[kubeinterface.AnnotationAllocation]
	waiting := cachetest.GPUPod("waiting", 16, 0, time.Now())
	waiting.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/2 nodes are available: 2 GPUs: not enough GPUs."}}
	capa := kubeinterface.Capacity{Nodes: 2, Updated: time.Now()}
	for range 16 {
		capa.Add("Tesla V100-SXM2-16GB", "nvidia.com/gpu", kubeinterface.GPUUse{Healthy: true})
	}
	value, err := kubeinterface.EncodeCapacity(capa)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: kubeinterface.CapacityConfigMap},
		Data: map[string]string{kubeinterface.CapacityKey: value}}
	return c, fake.NewClientset(mine, other, forged, waiting, cm)
}

// TestPodsCommand: `kubegpu pods` lists the namespace's GPU pods with
// their GPUs, the forged allocation as none, why the pending one waits,
// and the cluster's capacity; nothing of other namespaces.
func TestPodsCommand(t *testing.T) {
	c, client := tenantCluster(t)
	var out bytes.Buffer
	cmd := newPodsCommand(func() (kubernetes.Interface, error) { return client, nil }, func() string { return "ns" },
		func() (*kubeinterface.KeySet, error) { return kubeinterface.NewKeySet(c.key), nil })
	cmd.SetOut(&out)
	cmd.SetContext(context.Background())
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"mine", "node-0", "main=gpu", "forged", "none: ", "waiting: 0/2 nodes are available", "16 GPUs: 16 idle", "Tesla V100-SXM2-16GB (nvidia.com/gpu): 16 of 16 idle"} {
		if !strings.Contains(got, want) {
			t.Errorf("kubegpu pods lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\nother ") {
		t.Errorf("kubegpu pods shows another namespace's pod:\n%s", got)
	}
}

// TestTenantView: the page of a tenant shows the nodes its pods are on
// with the GPUs they hold, the cluster's capacity as totals, and no
// explanations.
func TestTenantView(t *testing.T) {
	c, client := tenantCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := newTenantWatcher(ctx, client, "ns", defaultCapacity)
	if err != nil {
		t.Fatal(err)
	}
	capa, note := readCapacity(ctx, client, defaultCapacity)
	if note != "" {
		t.Fatal(note)
	}
	v := tenantView("ns", storeOf[corev1.Pod](w.pods), nil, capa, note, kubeinterface.NewKeySet(c.key).Verify)
	sum := v.Summary.(uiSummary)
	if sum.Explain || sum.Totals.Total().GPUs != 16 || len(sum.Pending) != 1 {
		t.Errorf("summary %+v", sum)
	}
	if len(v.Nodes) != 2 {
		t.Fatalf("nodes %+v, want node-0 (mine) and node-1 (forged)", v.Nodes)
	}
	n0, n1 := v.Nodes[0].Data.(uiNode), v.Nodes[1].Data.(uiNode)
	if len(n0.GPUs) != 2 || n0.GPUs[0].Pods[0] != "ns/mine" || !n0.GPUs[0].Exclusive {
		t.Errorf("node-0 %+v", n0)
	}
	if len(n1.GPUs) != 0 || !strings.Contains(n1.Problem, "ns/forged holds no GPUs") {
		t.Errorf("node-1 %+v: the forged allocation counted", n1)
	}
}
