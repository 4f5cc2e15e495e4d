package capacity

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/kube-scheduler/devicecache"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// Interval is how often the capacity is computed.
const Interval = 15 * time.Second

// Compute counts the GPUs of the cache's live nodes at now.
func Compute(c *devicecache.Cache, now time.Time) kubeinterface.Capacity {
	var out kubeinterface.Capacity
	for _, v := range c.Nodes(now, false) {
		if v.Devices == nil || !v.Live {
			continue
		}
		out.Nodes++
		inv := v.Devices.Inventory()
		parents := map[string]bool{}
		for _, d := range inv.Devices {
			if d.Parent != "" {
				parents[d.Parent] = true
			}
		}
		st := &v.State
		for i, d := range inv.Devices {
			if parents[d.ID] {
				continue // a GPU in MIG mode: its instances count
			}
			bit := uint64(1) << i
			out.Add(d.Model, d.ServedAs(), kubeinterface.GPUUse{
				Healthy:   d.Health == types.Healthy,
				Used:      st.Used&bit != 0,
				Exclusive: st.Exclusive&bit != 0,
				FreeMiB:   st.MemFree[i],
				FreeMilli: int64(st.MilliFree[i]),
			})
		}
	}
	out.Sort()
	return out
}

// Publisher writes Compute's result into the ConfigMap Namespace/Name
// when it changed.
type Publisher struct {
	Cache           *devicecache.Cache
	Client          kubernetes.Interface
	Namespace, Name string
}

// Run publishes every Interval until ctx ends.
func (p *Publisher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("configMap", p.Namespace+"/"+p.Name)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	failing := false
	for {
		err := p.Publish(ctx, time.Now())
		switch {
		case err != nil && !failing:
			// Said once until it works again: every Interval would flood.
			logger.Error(err, "Publish the cluster's GPU capacity for tenants")
		case err == nil && failing:
			logger.Info("Publishing the cluster's GPU capacity again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Publish writes the capacity at now if the ConfigMap holds another.
func (p *Publisher) Publish(ctx context.Context, now time.Time) error {
	value, err := kubeinterface.EncodeCapacity(Compute(p.Cache, now))
	if err != nil {
		return err
	}
	cms := p.Client.CoreV1().ConfigMaps(p.Namespace)
	cm, err := cms.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "kubegpu"}},
			Data: map[string]string{kubeinterface.CapacityKey: value}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ConfigMap %s/%s: %w", p.Namespace, p.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get ConfigMap %s/%s: %w", p.Namespace, p.Name, err)
	case cm.Data[kubeinterface.CapacityKey] == value:
		return nil
	}
	cm.Data = map[string]string{kubeinterface.CapacityKey: value}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update ConfigMap %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
