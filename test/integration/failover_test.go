package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// Leader election of the failover test: shorter than the upstream defaults
// (15s, 10s, 2s) that the shipped configuration keeps, so that the test
// takes seconds; the takeover scales with leaseDuration.
const (
	failoverLeaseDuration = 6 * time.Second
	failoverRenewDeadline = 4 * time.Second
	failoverRetryPeriod   = time.Second
)

// startReplica starts a kubegpu-scheduler with the shipped configuration
// and leader election on, as the shipped Deployment runs two of them.
func startReplica(ctx context.Context, t *testing.T) *localcluster.Scheduler {
	t.Helper()
	config, err := cluster.ShippedSchedulerConfig(repoRoot+"/kube-scheduler/config/kubegpu-scheduler.yaml",
		schedulerID.Kubeconfig, pluginDir, keyFile, 500, "heartbeatStaleness: "+heartbeatStaleness.String())
	if err != nil {
		t.Fatal(err)
	}
	config, err = localcluster.WithLeaderElection(config, failoverLeaseDuration, failoverRenewDeadline, failoverRetryPeriod)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cluster.StartScheduler(ctx, binDir+"/kubegpu-scheduler", config, "kubegpu-scheduler", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// leaseHolder is the holder of the schedulers' leader election Lease.
func leaseHolder(ctx context.Context) string {
	l, err := cluster.Client.CoordinationV1().Leases("kube-system").Get(ctx, "kube-scheduler", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestSchedulerFailover: two replicas with leader election; the leader is
// SIGKILLed while pods stream in. The other takes over, every pod is bound
// once with an allocation that verifies, no device is given twice, and
// nothing that fits is left pending.
func TestSchedulerFailover(t *testing.T) {
	ctx := context.Background()
	nodes := addNodes(ctx, t, "failover", "dgx1", 8)
	ns := namespace(ctx, t, "failover")
	before := leaseHolder(ctx)
	leader := startReplica(ctx, t)
	var holder string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		holder = leaseHolder(ctx)
		return holder != "" && holder != before, nil
	}); err != nil {
		t.Fatal("the first replica did not become leader:", err)
	}
	startReplica(ctx, t)
	created := streamPods(ctx, t, ns, mixedPods("f", 120), 50*time.Millisecond)
	waitBoundAtLeast(ctx, t, ns, 30)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	list, _ := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	atKill := bound(list.Items)
	var took, firstBinding time.Duration
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if took == 0 {
			if h := leaseHolder(ctx); h != "" && h != holder {
				took = time.Since(killed)
			}
		}
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil && bound(list.Items) > atKill && firstBinding == 0 {
			firstBinding = time.Since(killed)
		}
		return took != 0 && firstBinding != 0, nil
	}); err != nil {
		t.Fatalf("no takeover within a minute of killing the leader (lease after %s, first binding after %s): %v", took, firstBinding, err)
	}
	t.Logf("leader killed with %d pods bound; the other replica held the lease after %s and bound its first pod after %s (leaseDuration %s)",
		atKill, took.Round(100*time.Millisecond), firstBinding.Round(100*time.Millisecond), failoverLeaseDuration)
	checkStream(ctx, t, ns, created, 120, nodes)
	for _, reason := range failedSchedulingAll(ctx, t, ns) {
		if strings.Contains(reason, "already") || strings.Contains(reason, "twice") {
			t.Errorf("a scheduling attempt says %q", reason)
		}
	}
}
