// Command soak runs kubegpu for a long time under churn and injected
// faults and checks, all along, that its guarantees hold: `make soak`
// (SOAK_DURATION, SOAK_SEED).
//
// It starts the test cluster of the integration tests (etcd,
// kube-apiserver with Node,RBAC authorization, NodeRestriction and the
// default admission plugins, kube-controller-manager) with kubegpu's
// shipped RBAC and policies, two kubegpu-scheduler replicas under leader
// election, each talking to the API server through a proxy of its own
// (toxiproxy) that can delay, reset and black-hole its connections,
// simulated GPU nodes drawn from the openb trace (each with its node's
// credentials and a simulated kubelet renewing its Lease) and one real
// node (kubelet → kubegpu-crishim → containerd, simulated T4s with the
// enforcer stand-in). A churn generator replays the trace's pods with
// lifetimes compressed to minutes: plain pods, GPU slices, Jobs, gangs,
// and high-priority pods that preempt; one pod in ten runs on the real
// node. A fault schedule drawn from the seed restarts kube-apiserver,
// etcd, the shim, containerd and kubelet, cuts the leader off from the
// API server while it keeps running, delays and resets its connections,
// stops and resumes nodes' Leases, skews nodes' clocks and rotates the
// allocation signing key.
//
// An independent checker (checker.go; it shares no code with the
// scheduler beyond the wire format and signature check of kubeinterface)
// reads the API and the real node's containers every few seconds and
// counts violations: a device held by two running pods, a bound GPU pod
// without an allocation that verifies, a container on the real node
// without exactly its pod's devices, a pod that fits left pending, leaked
// ledger entries, limits mounts or claim specs after their pods ended,
// and the components' memory and goroutines growing. The report goes to
// OUT/report.json and OUT/soak.png.
//
//	go run ./test/soak --bin-dir _output/bin --plugin-dir _output/plugins --node-bin-dir _output/tools/bin --duration 60m
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/internal/localnode"
)

type options struct {
	binDir, pluginDir, nodeBinDir, openb, out string
	duration                                  time.Duration
	seed                                      int64
	// nodes is the number of simulated GPU nodes.
	nodes int
	// keep leaves the work directory (logs, keys) in place.
	keep bool
	// faults are the fault kinds to inject (all by default).
	faults []fault
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "_output/bin", "kubegpu and Kubernetes binaries")
	flag.StringVar(&o.pluginDir, "plugin-dir", "_output/plugins", "device modules")
	flag.StringVar(&o.nodeBinDir, "node-bin-dir", "_output/tools/bin", "containerd, ctr and crictl for the real node")
	flag.StringVar(&o.openb, "openb", "../shared/data/openb", "directory of the openb trace (cluster-trace-gpu-v2023)")
	flag.StringVar(&o.out, "out", "_output/soak", "directory of the report")
	flag.DurationVar(&o.duration, "duration", time.Hour, "how long to churn and inject faults (the drain and the last checks come after)")
	flag.Int64Var(&o.seed, "seed", 1, "seed of the nodes, the pods and the fault schedule: the same seed gives the same run")
	flag.IntVar(&o.nodes, "nodes", 150, "simulated GPU nodes drawn from the trace")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, keys)")
	faultList := flag.String("faults", "", "comma-separated fault kinds to inject (default every kind: "+faultNames()+")")
	flag.Parse()
	var err error
	if o.faults, err = faultsNamed(*faultList); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	r, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	if r.Violations > 0 {
		fmt.Fprintf(os.Stderr, "soak: %d violations (see %s)\n", r.Violations, filepath.Join(o.out, "report.json"))
		os.Exit(1)
	}
}

func (o *options) validate() error {
	if o.duration < time.Minute {
		return fmt.Errorf("--duration %s: at least 1m", o.duration)
	}
	if o.nodes < 4 || o.nodes > 1000 {
		return fmt.Errorf("--nodes %d: between 4 and 1000", o.nodes)
	}
	if _, err := os.Stat("kube-scheduler/config/kubegpu-scheduler.yaml"); err != nil {
		return fmt.Errorf("run the soak from the repository's root: %w", err)
	}
	for _, f := range []string{"openb_node_list_gpu_node.csv", podTrace} {
		if _, err := os.Stat(filepath.Join(o.openb, f)); err != nil {
			return fmt.Errorf("the openb trace: %w (--openb, or OPENB for make soak)", err)
		}
	}
	for _, p := range []*string{&o.binDir, &o.pluginDir, &o.nodeBinDir, &o.openb, &o.out} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Printf("%s soak: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// run sets the cluster up, churns and injects faults for o.duration while
// the checker watches, drains, and writes the report.
func run(ctx context.Context, o options) (*report, error) {
	dir, err := os.MkdirTemp("", "kubegpu-soak-")
	if err != nil {
		return nil, err
	}
	s := &soak{o: o, dir: dir, stopping: make(chan struct{})}
	defer func() {
		s.stop()
		// The enforcer's limits mounts of containers that ran until the
		// end are the node's to remove; the node is gone.
		if err := localnode.UnmountUnder(dir); err != nil {
			logf("unmount under %s: %v", dir, err)
		}
		if o.keep {
			logf("work directory kept: %s", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	logf("work directory %s, seed %d, %s of churn and faults", dir, o.seed, o.duration)
	// client-go's own logs (retries while the API server is down) go to a
	// file of their own.
	klogFile, err := os.Create(filepath.Join(dir, "soak-client.log"))
	if err != nil {
		return nil, err
	}
	defer klogFile.Close()
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			return nil, err
		}
	}
	klog.SetOutput(klogFile)
	if err := s.setUp(ctx); err != nil {
		return nil, fmt.Errorf("set up: %w", err)
	}
	chk := newChecker(s, s.cluster.Client)
	s.simKubelets = &simKubelets{s: s, chk: chk}
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { chk.run(runCtx); close(done) }()
	churn := newChurn(s, chk)
	faults := newFaults(s, chk)
	churnDone, faultsDone := make(chan error, 1), make(chan error, 1)
	churnCtx, stopChurn := context.WithTimeout(runCtx, o.duration)
	defer stopChurn()
	go func() { churnDone <- churn.run(churnCtx) }()
	go func() { faultsDone <- faults.run(churnCtx, runCtx) }()
	if err := <-churnDone; err != nil {
		return nil, fmt.Errorf("churn: %w", err)
	}
	logf("churn over after %s: draining while the last faults end", time.Since(start).Round(time.Second))
	if err := churn.drain(ctx, chk); err != nil && ctx.Err() == nil {
		chk.violate("drain", "", "%v", err)
	}
	if err := <-faultsDone; err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	chk.finalChecks(ctx)
	cancel()
	<-done
	r := chk.report(o, churn, faults, start, time.Since(start))
	if err := r.write(o.out); err != nil {
		return r, err
	}
	logf("%d pods scheduled, %d faults, %d violations: %s", r.PodsScheduled, r.Faults, r.Violations, filepath.Join(o.out, "report.json"))
	return r, ctx.Err()
}

// every calls fn every period until ctx ends.
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}
