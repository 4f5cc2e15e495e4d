//go:build schedperf

package schedperf

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/kubernetes/test/utils/client-go/ktesting"
)

// processState is what the process carries from one test case to the next
// (its goroutines and live heap, after a collection), the CPU it has used,
// and the machine's CPU time by kind, from /proc/stat: what else ran
// beside the benchmark (other processes, and steal: a virtual machine's
// CPU taken by its host) shows why two rounds disagree.
type processState struct {
	at         time.Time
	goroutines int
	heap       uint64
	cpu        time.Duration
	// machine is /proc/stat's first line (user, nice, system, idle,
	// iowait, irq, softirq, steal) in clock ticks; nil where unreadable.
	machine []uint64
}

// since is what the machine did between s0 and s: the process's CPU, the
// machine's CPU used by all processes and stolen by its host, in seconds.
func (s processState) since(s0 processState) string {
	out := fmt.Sprintf("%.1f s, process %.1f CPU-s", s.at.Sub(s0.at).Seconds(), (s.cpu - s0.cpu).Seconds())
	if len(s.machine) >= 8 && len(s0.machine) >= 8 {
		d := make([]float64, 8)
		for i := range d {
			// Counters the kernel lets go backwards (iowait; steal
			// after a migration) count as zero, not as a wrap.
			if s.machine[i] > s0.machine[i] {
				d[i] = float64(s.machine[i]-s0.machine[i]) / 100 // USER_HZ
			}
		}
		busy := d[0] + d[1] + d[2] + d[5] + d[6]
		out += fmt.Sprintf(", machine busy %.1f CPU-s, idle %.1f, iowait %.1f, steal %.1f", busy, d[3], d[4], d[7])
	}
	return out
}

func machineCPU() []uint64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return nil
	}
	var ticks []uint64
	for _, f := range fields[1:9] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil
		}
		ticks = append(ticks, n)
	}
	return ticks
}

func snapshot() processState {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return processState{
		at:         time.Now(),
		goroutines: runtime.NumGoroutine(),
		heap:       m.HeapAlloc,
		cpu:        time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		machine:    machineCPU(),
	}
}

func (s processState) String() string {
	return fmt.Sprintf("%d goroutines, %d MiB live heap, %.1f CPU-s", s.goroutines, s.heap>>20, s.cpu.Seconds())
}

// profile writes a CPU profile of the process for the workload (its nodes'
// creation, the pods before and the pods measured) to
// $KUBEGPU_SCHEDPERF_PROFILE_DIR/<test name>-<time>.pprof, if that is set,
// and its mutex contention and blocking (sampled) beside it
// (.mutex.pprof, .block.pprof, with .base.pprof snapshots of their start).
func profile(tCtx ktesting.TContext) (stop func(), err error) {
	dir := os.Getenv("KUBEGPU_SCHEDPERF_PROFILE_DIR")
	if dir == "" {
		return func() {}, nil
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tCtx.Name()) + time.Now().Format("-150405") + ".pprof"
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	// Where the scheduler waits rather than computes: lock contention
	// and blocking, beside the CPU profile. Go counts them from the
	// process's start, so they are written at the workload's start too
	// (.base): go tool pprof -base X.mutex.base.pprof X.mutex.pprof.
	runtime.SetMutexProfileFraction(100)
	runtime.SetBlockProfileRate(int(time.Millisecond))
	write := func(kind, suffix string) {
		if w, err := os.Create(strings.TrimSuffix(f.Name(), ".pprof") + "." + kind + suffix); err == nil {
			_ = pprof.Lookup(kind).WriteTo(w, 0)
			w.Close()
		}
	}
	write("mutex", ".base.pprof")
	write("block", ".base.pprof")
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		write("mutex", ".pprof")
		write("block", ".pprof")
		runtime.SetMutexProfileFraction(0)
		runtime.SetBlockProfileRate(0)
	}, nil
}
