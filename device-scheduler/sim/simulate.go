package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// Policy names the simulator knows.
const (
	PolicyRandom        = "random"
	PolicyDotProduct    = "dotproduct"
	PolicyGPUClustering = "gpuclustering"
	PolicyGPUPacking    = "gpupacking"
	PolicyBestFit       = "bestfit"
	PolicyFGD           = "fgd"
	PolicyKubegpu       = "kubegpu"
	// PolicyKubegpuOnline is the engine learning the workload mix online.
	PolicyKubegpuOnline = "kubegpu-online"
)

// policies maps each policy to its constructor: the FGD paper's baselines
// and FGD as its artifact implements them, and kubegpu's engine over the
// caller's devices.
var policies = map[string]func(*Experiment, Devices) (Scheduler, error){
	PolicyRandom:        func(x *Experiment, _ Devices) (Scheduler, error) { return newRandom(x), nil },
	PolicyDotProduct:    func(x *Experiment, _ Devices) (Scheduler, error) { return newBaseline(x, dotProduct{}), nil },
	PolicyGPUClustering: func(x *Experiment, _ Devices) (Scheduler, error) { return newBaseline(x, gpuClustering{}), nil },
	PolicyGPUPacking:    func(x *Experiment, _ Devices) (Scheduler, error) { return newBaseline(x, gpuPacking{}), nil },
	PolicyBestFit: func(x *Experiment, _ Devices) (Scheduler, error) {
		b := newBaseline(x, bestFit{})
		b.normalize = true
		return b, nil
	},
	PolicyFGD: func(x *Experiment, _ Devices) (Scheduler, error) { return newFGD(x), nil },
	PolicyKubegpu: func(x *Experiment, devs Devices) (Scheduler, error) {
		return newEngineScheduler(x, devs, devicescheduler.PolicyKubegpu, false)
	},
	PolicyKubegpuOnline: func(x *Experiment, devs Devices) (Scheduler, error) {
		return newEngineScheduler(x, devs, devicescheduler.PolicyKubegpu, true)
	},
}

// NewScheduler returns policy's scheduler for x, for callers that replay
// one policy themselves (Replay). The kubegpu policies run the engine over
// devs; the baselines ignore it.
func NewScheduler(x *Experiment, policy string, devs Devices) (Scheduler, error) {
	if err := CheckPolicies([]string{policy}); err != nil {
		return nil, err
	}
	return policies[policy](x, devs)
}

// Policies lists the policies compared by default, in the order of the FGD
// paper's figures, then kubegpu's.
func Policies() []string {
	return []string{PolicyRandom, PolicyDotProduct, PolicyGPUClustering, PolicyGPUPacking, PolicyBestFit, PolicyFGD, PolicyKubegpu}
}

// CheckPolicies rejects unknown policy names.
func CheckPolicies(names []string) error {
	for _, n := range names {
		if _, ok := policies[n]; !ok {
			return fmt.Errorf("unknown policy %q (known: %s)", n, strings.Join(append(Policies(), PolicyKubegpuOnline), ", "))
		}
	}
	return nil
}

// Stat is a mean and range over seeds.
type Stat struct {
	Mean, Min, Max float64
}

func stat(values []float64) Stat {
	s := Stat{Min: math.Inf(1), Max: math.Inf(-1)}
	n := 0
	for _, v := range values {
		if math.IsNaN(v) {
			continue
		}
		s.Mean += v
		s.Min, s.Max = min(s.Min, v), max(s.Max, v)
		n++
	}
	if n == 0 {
		return Stat{Mean: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s.Mean /= float64(n)
	return s
}

// Summary is one policy's results over all seeds.
type Summary struct {
	Policy string
	// AllocAt100 is the GPU allocation (% of capacity) when 100% of the
	// capacity has arrived.
	AllocAt100 Stat
	// UnallocAt130 is the GPU capacity (%) left unallocated when 130% has
	// arrived (or at the inflation's end, if lower).
	UnallocAt130 Stat
	Runs         []Run
}

// Options configure Simulate.
type Options struct {
	Policies []string
	Seeds    []int64
	Inflate  float64
	// Parallel bounds concurrent runs (default: the number of CPUs).
	Parallel int
	// Progress, if set, is called with pods done and pods in all.
	Progress func(done, total int64)
	// Devices are the engine's device modules and the nodes' devices, for
	// the kubegpu policies.
	Devices Devices
}

// Simulate replays the trace under every policy and seed.
func Simulate(ctx context.Context, nodes []NodeSpec, pods []PodSpec, opts Options) ([]Summary, error) {
	if err := CheckPolicies(opts.Policies); err != nil {
		return nil, err
	}
	for _, p := range opts.Policies {
		if usesEngine(p) {
			if err := opts.Devices.check(); err != nil {
				return nil, fmt.Errorf("policy %s: %w", p, err)
			}
		}
	}
	if len(opts.Seeds) == 0 {
		return nil, errors.New("no seeds")
	}
	exps := make([]*Experiment, len(opts.Seeds))
	var total int64
	for i, seed := range opts.Seeds {
		x, err := NewExperiment(nodes, pods, seed, opts.Inflate)
		if err != nil {
			return nil, err
		}
		exps[i] = x
		total += int64(len(x.Pods) * len(opts.Policies))
	}
	type job struct{ policy, seed int }
	jobs := make(chan job)
	runs := make([][]Run, len(opts.Policies))
	for i := range runs {
		runs[i] = make([]Run, len(exps))
	}
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	workers := opts.Parallel
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				x := exps[j.seed]
				s, err := policies[opts.Policies[j.policy]](x, opts.Devices)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("policy %s: %w", opts.Policies[j.policy], err) })
					continue
				}
				var tick func()
				if opts.Progress != nil {
					tick = func() {
						if d := done.Add(1); d%256 == 0 || d == total {
							opts.Progress(d, total)
						}
					}
				}
				runs[j.policy][j.seed] = Replay(x, opts.Policies[j.policy], s, tick)
			}
		}()
	}
	// Slow policies first, so that the last minutes are not one long run.
	order := slices.Clone(opts.Policies)
	slices.SortStableFunc(order, func(a, b string) int { return cost(b) - cost(a) })
feed:
	for _, name := range order {
		p := slices.Index(opts.Policies, name)
		for s := range exps {
			select {
			case jobs <- job{p, s}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	out := make([]Summary, len(opts.Policies))
	for i, name := range opts.Policies {
		var at100, at130 []float64
		for _, r := range runs[i] {
			at100 = append(at100, r.AllocAt(100))
			a := min(130, len(r.Curve)-1)
			at130 = append(at130, 100-r.AllocAt(a))
		}
		out[i] = Summary{Policy: name, AllocAt100: stat(at100), UnallocAt130: stat(at130), Runs: runs[i]}
	}
	return out, nil
}

func cost(policy string) int {
	if usesEngine(policy) || policy == PolicyFGD {
		return 1
	}
	return 0
}

// usesEngine reports whether policy runs the allocation engine, which needs
// Devices.
func usesEngine(policy string) bool {
	return policy == PolicyKubegpu || policy == PolicyKubegpuOnline
}
