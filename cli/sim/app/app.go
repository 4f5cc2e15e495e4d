// Package app holds kubegpu-sim's cobra commands: the placement simulator
// (device-scheduler/sim) run over simulated GPUs (internal/tracegpus).
package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/internal/tracegpus"
	"github.com/kubegpu/kubegpu/utils/version"
)

// NewCommand returns the kubegpu-sim root command.
func NewCommand(ctx context.Context) *cobra.Command {
	cmd := &cobra.Command{
		Use:          "kubegpu-sim",
		Short:        "Replay GPU cluster traces through kubegpu's allocation engine",
		SilenceUsage: true,
		RunE:         func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.SetContext(ctx)
	cmd.AddCommand(newPlacementCommand(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "kubegpu-sim", version.Get())
			return err
		},
	})
	return cmd
}

type placementOptions struct {
	Nodes     string
	Pods      string
	Policies  []string
	Seeds     int
	FirstSeed int64
	Inflate   float64
	JSON      bool
	Plot      string
	Parallel  int
	Progress  string
}

func newPlacementCommand() *cobra.Command {
	defaultDir := filepath.Join("..", "shared", "data", "openb")
	o := &placementOptions{}
	cmd := &cobra.Command{
		Use:   "placement",
		Short: "Replay a node list and a pod list under each placement policy",
		Long: `Replays the pods of a trace, in a seeded random order and inflated by random
draws until --inflate times the cluster's GPU capacity has arrived, under each
policy, as the FGD paper (USENIX ATC 2023) does on the Alibaba openb trace.
Prints, per policy, the GPU allocation when 100% of the capacity has arrived
and the GPU capacity left unallocated at 130%, as mean (min-max) over seeds.`,
		Example: `  kubegpu-sim placement --nodes ../shared/data/openb/openb_node_list_gpu_node.csv \
      --pods ../shared/data/openb/openb_pod_list_default.csv --seeds 10 --plot alloc.png`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.Nodes, "nodes", filepath.Join(defaultDir, "openb_node_list_gpu_node.csv"), "node list CSV: sn,cpu_milli,memory_mib,gpu,model")
	f.StringVar(&o.Pods, "pods", filepath.Join(defaultDir, "openb_pod_list_default.csv"), "pod list CSV: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]")
	f.StringSliceVar(&o.Policies, "policies", sim.Policies(), "policies to compare")
	f.IntVar(&o.Seeds, "seeds", 10, "number of seeds")
	f.Int64Var(&o.FirstSeed, "first-seed", 42, "first seed; seeds are consecutive")
	f.Float64Var(&o.Inflate, "inflate", 1.3, "inflate the workload until this multiple of the GPU capacity has arrived")
	f.BoolVar(&o.JSON, "json", false, "print JSON, one object per policy")
	f.StringVar(&o.Plot, "plot", "", "write a PNG of allocation vs arrived workload per policy")
	f.IntVar(&o.Parallel, "parallel", 0, "concurrent runs (default: number of CPUs)")
	f.StringVar(&o.Progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), always or never")
	return cmd
}

func (o *placementOptions) run(cmd *cobra.Command) error {
	if o.Seeds < 1 {
		return fmt.Errorf("--seeds must be at least 1, got %d", o.Seeds)
	}
	if err := sim.CheckPolicies(o.Policies); err != nil {
		return err
	}
	nodes, err := sim.ReadNodes(o.Nodes)
	if err != nil {
		return err
	}
	pods, err := sim.ReadPods(o.Pods)
	if err != nil {
		return err
	}
	seeds := make([]int64, o.Seeds)
	for i := range seeds {
		seeds[i] = o.FirstSeed + int64(i)
	}
	plugins, err := tracegpus.Plugins()
	if err != nil {
		return err
	}
	opts := sim.Options{Policies: o.Policies, Seeds: seeds, Inflate: o.Inflate, Parallel: o.Parallel,
		Devices: sim.Devices{Plugins: plugins, Inventory: tracegpus.Inventory}}
	bar, err := o.progressBar(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if bar != nil {
		opts.Progress = func(done, total int64) {
			bar.ChangeMax64(total)
			_ = bar.Set64(done)
		}
	}
	start := time.Now()
	sums, err := sim.Simulate(cmd.Context(), nodes, pods, opts)
	if bar != nil {
		_ = bar.Finish()
		fmt.Fprintln(cmd.ErrOrStderr())
	}
	if err != nil {
		return err
	}
	if o.Plot != "" {
		if err := writePlot(o.Plot, filepath.Base(o.Pods), sums); err != nil {
			return err
		}
	}
	out := cmd.OutOrStdout()
	if o.JSON {
		return writeJSON(out, sums)
	}
	return writeTable(out, o, sums, time.Since(start))
}

func (o *placementOptions) progressBar(w io.Writer) (*progressbar.ProgressBar, error) {
	show := false
	switch o.Progress {
	case "always":
		show = true
	case "never":
	case "auto":
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				show = true
			}
		}
	default:
		return nil, fmt.Errorf("--progress must be auto, always or never, got %q", o.Progress)
	}
	if !show {
		return nil, nil
	}
	return progressbar.NewOptions64(1,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("replaying pods"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(200*time.Millisecond),
	), nil
}

// policyJSON is one policy's line of --json output. Values a run did not
// reach are null.
type policyJSON struct {
	Policy       string      `json:"policy"`
	AllocAt100   *float64    `json:"alloc_at_100"`
	UnallocAt130 *float64    `json:"unalloc_at_130"`
	AllocRange   [2]*float64 `json:"alloc_at_100_range"`
	UnallocRange [2]*float64 `json:"unalloc_at_130_range"`
	Seeds        []seedJSON  `json:"seeds"`
}

type seedJSON struct {
	Seed         int64    `json:"seed"`
	AllocAt100   *float64 `json:"alloc_at_100"`
	UnallocAt130 *float64 `json:"unalloc_at_130"`
	Placed       int      `json:"placed"`
	Failed       int      `json:"failed"`
}

func writeJSON(w io.Writer, sums []sim.Summary) error {
	enc := json.NewEncoder(w)
	for _, s := range sums {
		p := policyJSON{
			Policy: s.Policy, AllocAt100: round2(s.AllocAt100.Mean), UnallocAt130: round2(s.UnallocAt130.Mean),
			AllocRange:   [2]*float64{round2(s.AllocAt100.Min), round2(s.AllocAt100.Max)},
			UnallocRange: [2]*float64{round2(s.UnallocAt130.Min), round2(s.UnallocAt130.Max)},
		}
		for _, r := range s.Runs {
			a := min(130, len(r.Curve)-1)
			p.Seeds = append(p.Seeds, seedJSON{Seed: r.Seed, AllocAt100: round2(r.AllocAt(100)), UnallocAt130: round2(100 - r.AllocAt(a)), Placed: r.Placed, Failed: r.Failed})
		}
		if err := enc.Encode(p); err != nil {
			return err
		}
	}
	return nil
}

func writeTable(w io.Writer, o *placementOptions, sums []sim.Summary, took time.Duration) error {
	fmt.Fprintf(w, "Trace: %s on %s, %d seeds from %d, inflated to %.0f%% of GPU capacity (%s)\n\n",
		filepath.Base(o.Pods), filepath.Base(o.Nodes), o.Seeds, o.FirstSeed, o.Inflate*100, took.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tGPU ALLOCATED AT 100% ARRIVED\tGPU UNALLOCATED AT 130% ARRIVED")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Policy, formatStat(s.AllocAt100), formatStat(s.UnallocAt130))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nValues are % of the cluster's GPU capacity: mean (min-max) over seeds.")
	return nil
}

func formatStat(s sim.Stat) string {
	if math.IsNaN(s.Mean) {
		return "n/a"
	}
	return fmt.Sprintf("%6.2f (%.2f-%.2f)", s.Mean, s.Min, s.Max)
}

// round2 rounds to two decimals; NaN becomes nil (JSON null).
func round2(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	r := math.Round(v*100) / 100
	return &r
}

// policyLabel is a policy's name in the plot legend.
func policyLabel(p string) string { return strings.ToUpper(p[:1]) + p[1:] }
