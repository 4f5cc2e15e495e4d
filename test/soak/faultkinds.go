package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

func (f *faults) apiserverRestart(ctx context.Context, rng *rand.Rand) error {
	c := f.s.cluster
	if rng.IntN(2) == 0 {
		_ = c.KillAPIServer()
	} else if err := c.StopAPIServer(); err != nil {
		// A graceful stop that outlasts its 30 s ends in SIGKILL: down
		// either way, which is the fault.
		logf("fault: %v", err)
	}
	sleep(ctx, time.Duration(2+rng.IntN(10))*time.Second)
	return c.StartAPIServer(ctx)
}

func (f *faults) etcdRestart(ctx context.Context, rng *rand.Rand) error {
	return f.s.cluster.RestartEtcd(ctx)
}

// leaderMetric is kube-scheduler's sample that says it leads.
const leaderMetric = `leader_election_master_status{name="kube-scheduler"}`

// leader waits up to two minutes for a replica to say it holds the lease
// (its leader_election_master_status metric): after another fault there
// may be none for a while, and reading the metric needs the API server
// (the scrape is authorized through it).
func (f *faults) leader(ctx context.Context) *replica {
	var leader *replica
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, r := range f.s.replicas {
			if m, err := r.scrape(ctx, leaderMetric); err == nil && m[leaderMetric] == 1 {
				leader = r
				return true, nil
			}
		}
		return false, nil
	})
	return leader
}

// leaderPartition black-holes the leader's connections to the API server
// (its process keeps running) for longer than its lease: the other
// replica takes over while the old leader may still be binding.
func (f *faults) leaderPartition(ctx context.Context, rng *rand.Rand) error {
	return f.withLeaderToxic(ctx, "timeout", map[string]int{"timeout": 0}, leaseDuration+renewDeadline+5*time.Second)
}

// leaderLatency delays the leader's traffic by 1–3 s each way for a minute.
func (f *faults) leaderLatency(ctx context.Context, rng *rand.Rand) error {
	return f.withLeaderToxic(ctx, "latency", map[string]int{"latency": 1000 + rng.IntN(2000), "jitter": 500}, time.Minute)
}

// leaderReset resets the leader's connections for 5 s.
func (f *faults) leaderReset(ctx context.Context, rng *rand.Rand) error {
	return f.withLeaderToxic(ctx, "reset_peer", map[string]int{"timeout": 0}, 5*time.Second)
}

func (f *faults) withLeaderToxic(ctx context.Context, typ string, attrs map[string]int, d time.Duration) error {
	r := f.leader(ctx)
	if r == nil {
		return errors.New("no replica said it leads for two minutes")
	}
	for _, stream := range []string{"upstream", "downstream"} {
		if err := toxic(r.proxy, typ+"-"+stream, typ, stream, attrs); err != nil {
			_ = r.proxy.Toxics.RemoveToxic(ctx, typ+"-upstream")
			return fmt.Errorf("toxic %s on replica %s: %w", typ, r.name, err)
		}
	}
	logf("fault: replica %s's connections get %s %v for %s", r.name, typ, attrs, d)
	sleep(ctx, d)
	for _, stream := range []string{"upstream", "downstream"} {
		if err := r.proxy.Toxics.RemoveToxic(ctx, typ+"-"+stream); err != nil {
			return fmt.Errorf("remove toxic %s from replica %s: %w", typ, r.name, err)
		}
	}
	return nil
}

func (f *faults) shimRestart(ctx context.Context, rng *rand.Rand) error {
	return f.s.real.RestartShim(ctx, "")
}

func (f *faults) containerdRestart(ctx context.Context, rng *rand.Rand) error {
	return f.s.real.RestartContainerd(ctx)
}

func (f *faults) kubeletRestart(ctx context.Context, rng *rand.Rand) error {
	return f.s.real.RestartKubelet(ctx)
}

// randomSimNode is a simulated node drawn from the seed.
func (f *faults) randomSimNode(rng *rand.Rand) (string, *simNode) {
	name := f.s.simNames[rng.IntN(len(f.s.simNames))]
	return name, f.s.simNode(name)
}

// leasePause stops a node's Lease renewals for longer than the plugin's
// heartbeatStaleness and kube-controller-manager's grace period, then
// restarts its kubelet stand-in (which reports the node Ready again).
func (f *faults) leasePause(ctx context.Context, rng *rand.Rand) error {
	name, n := f.randomSimNode(rng)
	logf("fault: node %s stops renewing its Lease", name)
	n.kubelet.Pause()
	sleep(ctx, 90*time.Second)
	return n.kubelet.Restart(ctx)
}

// clockSkew sets three nodes' clocks off by ±2–10 minutes for three
// minutes: their renewals carry times far from the scheduler's.
func (f *faults) clockSkew(ctx context.Context, rng *rand.Rand) error {
	var skewed []*simNode
	for range 3 {
		name, n := f.randomSimNode(rng)
		off := time.Duration(2+rng.IntN(9)) * time.Minute
		if rng.IntN(2) == 0 {
			off = -off
		}
		logf("fault: node %s's clock off by %s", name, off)
		n.clock.set(off)
		skewed = append(skewed, n)
	}
	sleep(ctx, 3*time.Minute)
	for _, n := range skewed {
		n.clock.set(0)
	}
	return nil
}

// keyRotation rotates the allocation signing key as the docs say: nodes
// trust the new key beside the old one; the replicas, one after the
// other, sign with the new key and still count the old key's allocations;
// once no pod carries the old key, nodes drop it.
func (f *faults) keyRotation(ctx context.Context, rng *rand.Rand) error {
	k := f.s.keys
	old := k.newest()
	next, err := k.add()
	if err != nil {
		return err
	}
	both, err := k.trust(old, next)
	if err != nil {
		return err
	}
	k.setTrusted(both)
	if err := f.withPart("real-node", func() error { return f.s.real.RestartShim(ctx, both) }); err != nil {
		return err
	}
	// The replicas' restarts stop scheduling for a while; the wait for the
	// old key's pods to go does not.
	f.chk.faultStarted("replica-restart")
	for _, r := range f.s.replicas {
		if err := r.restart(ctx, k.gen(next).private, k.gen(old).public); err != nil {
			f.chk.faultEnded("replica-restart")
			return err
		}
	}
	f.chk.faultEnded("replica-restart")
	logf("fault: the replicas sign with key %s; waiting until no pod carries key %s", k.gen(next).id, k.gen(old).id)
	if err := f.chk.waitKeyRetired(ctx, k.gen(old).id, 10*time.Minute); err != nil {
		return err
	}
	only, err := k.trust(next)
	if err != nil {
		return err
	}
	k.setTrusted(only)
	return f.withPart("real-node", func() error { return f.s.real.RestartShim(ctx, only) })
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// forceDelete is an operator's force delete of a GPU pod on a node whose
// kubelet is down (`kubectl delete --force --grace-period=0`, as for a node
// that does not answer): the pod is gone from the API while its container
// runs, and the scheduler gives its GPU to another pod. Once kubelet is
// back, the node must not run both containers on the GPU at once (the
// shim's ledger refuses the new one until kubelet has stopped the old):
// the node's containers are checked every half second for a minute.
func (f *faults) forceDelete(ctx context.Context, rng *rand.Rand) error {
	var victim *corev1.Pod
	for _, p := range f.chk.podsNow() {
		if p.Spec.NodeName == realNode && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			victim = p
			break
		}
	}
	if victim == nil {
		return fmt.Errorf("%w: no pod runs on %s", errNothingToDo, realNode)
	}
	if err := f.s.real.StopKubelet(); err != nil {
		return err
	}
	logf("fault: kubelet of %s down; force-deleting pod %s, whose container keeps running", realNode, victim.Name)
	err := f.s.cluster.Client.CoreV1().Pods(victim.Namespace).Delete(ctx, victim.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &victim.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		_ = f.s.real.StartKubelet(ctx)
		return fmt.Errorf("force-delete pod %s: %w", victim.Name, err)
	}
	// Time for the scheduler to give the GPU to a waiting pod.
	sleep(ctx, 30*time.Second)
	if err := f.s.real.StartKubelet(ctx); err != nil {
		return err
	}
	f.chk.watchNode(ctx, time.Minute, 500*time.Millisecond)
	return nil
}
