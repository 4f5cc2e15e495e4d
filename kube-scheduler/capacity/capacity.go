package capacity

import (
	"context"
	"fmt"
	"time"

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
	out.Bound()
	return out
}

// Publisher writes Compute's result into the ConfigMap Namespace/Name,
// which the manifests create (the scheduler may update only that one).
type Publisher struct {
	Cache           *devicecache.Cache
	Client          kubernetes.Interface
	Namespace, Name string
	// last is the capacity computed the time before, encoded without its
	// time.
	last string
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

// Publish writes the capacity at now when the ConfigMap holds none, a
// stale one (older than kubeinterface.CapacityRefresh), or another one
// than the last two computations agree on: replicas whose caches differ
// for a moment (a pod the leader is binding) do not overwrite each other
// at every turn.
func (p *Publisher) Publish(ctx context.Context, now time.Time) error {
	capa := Compute(p.Cache, now)
	value, err := kubeinterface.EncodeCapacity(capa)
	if err != nil {
		return err
	}
	last := p.last
	p.last = value
	cms := p.Client.CoreV1().ConfigMaps(p.Namespace)
	cm, err := cms.Get(ctx, p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("ConfigMap %s/%s does not exist: kube-scheduler/deploy/capacity.yaml (or the chart) creates it: %w", p.Namespace, p.Name, err)
	}
	if err != nil {
		return fmt.Errorf("get ConfigMap %s/%s: %w", p.Namespace, p.Name, err)
	}
	stored, err := kubeinterface.DecodeCapacity(cm.Data[kubeinterface.CapacityKey])
	fresh := err == nil && now.Sub(stored.Updated) < kubeinterface.CapacityRefresh
	if fresh {
		old := stored
		old.Updated = time.Time{}
		if same, _ := kubeinterface.EncodeCapacity(old); same == value || value != last {
			return nil
		}
	}
	capa.Updated = now.UTC().Truncate(time.Second)
	if value, err = kubeinterface.EncodeCapacity(capa); err != nil {
		return err
	}
	cm.Data = map[string]string{kubeinterface.CapacityKey: value}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update ConfigMap %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
