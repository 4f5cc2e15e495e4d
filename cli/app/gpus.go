package app

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// GPU is one row of `kubegpu gpus`, also its JSON and YAML form.
type GPU struct {
	Node  string `json:"node"`
	Index int    `json:"index"`
	ID    string `json:"id"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// Resource is the extended resource it serves (nvidia.com/gpu,
	// amd.com/gpu, ...).
	Resource    string   `json:"resource"`
	Health      string   `json:"health"`
	Parent      string   `json:"parent,omitempty"`
	MemoryMiB   int64    `json:"memoryMiB"`
	UsedMiB     int64    `json:"usedMemoryMiB"`
	UsedCores   int      `json:"usedCoresPercent"`
	Exclusive   bool     `json:"exclusive"`
	Pods        []string `json:"pods"`
	NodeProblem string   `json:"nodeProblem,omitempty"`
	// SliceEnforcer is the mechanism that holds this GPU's slices to
	// their grant on its node; empty when none does.
	SliceEnforcer string `json:"sliceEnforcer,omitempty"`
	// Slices are the pods with a slice of this GPU and what their node
	// recorded of its enforcement.
	Slices []SliceState `json:"slices,omitempty"`
	// DRA names the other DRA driver's ResourceSlice and device that
	// publish this GPU as well; kubegpu places no GPU pod on its node
	// while one does.
	DRA string `json:"dra,omitempty"`
}

// SliceState is a slice's enforcement as its pod's kubegpu.io/Enforced
// condition says: State is Enforced, Mismatch, Unproven, Unenforced, or
// Unrecorded before the node has checked it.
type SliceState struct {
	Pod     string `json:"pod"`
	State   string `json:"state"`
	Message string `json:"message,omitempty"`
}

func newGPUsCommand(client func() (kubernetes.Interface, error), key func() (*kubeinterface.KeySet, error)) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List every GPU: node, model, memory and compute in use, and its pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains([]string{"", "wide", "json", "yaml"}, output) {
				return fmt.Errorf("--output must be wide, json or yaml, got %q", output)
			}
			c, err := client()
			if err != nil {
				return err
			}
			k, err := key()
			if err != nil {
				return err
			}
			s, err := loadState(cmd.Context(), c, k)
			if err != nil {
				return err
			}
			rows := gpus(s)
			markDRA(s, rows)
			if err := printGPUs(cmd.OutOrStdout(), rows, output); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output == "json" || output == "yaml" {
				w = cmd.ErrOrStderr()
			}
			printDRA(w, s, rows)
			if s.unverifiedClaims > 0 {
				fmt.Fprintf(w, "\nNot counted: %d allocated ResourceClaim(s) of kubegpu's DeviceClass whose signed allocation does not verify; they hold no GPUs.\n", s.unverifiedClaims)
			}
			return printUnverified(w, s.unverified, k != nil)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: wide, json or yaml")
	return cmd
}

// gpus computes every device's use from the pods' allocations and the
// ResourceClaims'.
func gpus(s *clusterState) []GPU {
	var out []GPU
	for _, n := range s.nodes {
		if !n.hasInventory() {
			continue
		}
		byID := map[string]int{}
		for _, d := range n.inv.Devices {
			byID[d.ID] = len(out)
			out = append(out, GPU{Node: n.name, Index: d.Index, ID: d.ID, UUID: d.UUID, Model: d.Model, Resource: d.ServedAs(),
				Health: string(d.Health), Parent: d.Parent, MemoryMiB: d.MemoryMiB, Pods: []string{}, SliceEnforcer: d.SliceEnforcer})
		}
		hold := func(alloc types.PodAllocation, names []string, slice func() SliceState) {
			for _, c := range append(append([]types.ContainerAllocation{}, alloc.InitContainers...), alloc.Containers...) {
				for _, sh := range c.Devices {
					i, ok := byID[sh.ID]
					if !ok {
						continue
					}
					g := &out[i]
					if sh.Exclusive {
						g.Exclusive, g.UsedMiB, g.UsedCores = true, g.MemoryMiB, 100
					} else {
						g.UsedMiB += sh.MemoryMiB
						g.UsedCores += sh.ComputePercent
						if st := slice(); !slices.ContainsFunc(g.Slices, func(s SliceState) bool { return s.Pod == st.Pod }) {
							g.Slices = append(g.Slices, st) // once per GPU
						}
					}
					for _, name := range names {
						if !slices.Contains(g.Pods, name) {
							g.Pods = append(g.Pods, name)
						}
					}
				}
			}
		}
		for _, pa := range s.pods[n.name] {
			pod := pa.pod.Namespace + "/" + pa.pod.Name
			name := pod
			if pa.annotationDiffers {
				// Counted by the scheduler's record; new containers
				// get what the changed annotation says, or nothing.
				name += " (annotation changed)"
			}
			if borrowing(pa.pod) {
				name += " (borrowing)"
			}
			hold(pa.alloc.PodAllocation, []string{name}, func() SliceState {
				// The condition is the pod's.
				e := objects.PodEnforcement(pa.pod)
				if e.State == "" {
					e.State = "Unrecorded"
				}
				return SliceState{Pod: pod, State: e.State, Message: e.Message}
			})
		}
		// ResourceClaims' devices, held for their pods.
		for _, h := range s.claimHolds[n.name] {
			hold(h.alloc, h.holders(), func() SliceState {
				return SliceState{Pod: h.claim.Namespace + "/" + h.claim.Name + " (claim)", State: "Unrecorded"}
			})
		}
	}
	return out
}

func printGPUs(w io.Writer, rows []GPU, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case "yaml":
		b, err := yaml.Marshal(rows)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "NODE\tGPU\tMODEL\tMEMORY USED/TOTAL\tCORES USED\tPODS\tSLICE ENFORCEMENT"
	if output == "wide" {
		header += "\tID\tUUID\tHEALTH"
	}
	fmt.Fprintln(tw, header)
	for _, g := range rows {
		// Holders of claims come from reservedFor, which anyone who may
		// write a claim's status names freely.
		pods := sanitize(strings.Join(g.Pods, ","))
		if pods == "" {
			pods = "-"
		}
		idx := fmt.Sprint(g.Index)
		if g.Parent != "" {
			idx = g.ID // a MIG slice
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%d/%d MiB\t%d%%\t%s\t%s", g.Node, sanitize(idx), sanitize(g.Model), g.UsedMiB, g.MemoryMiB, g.UsedCores, pods, sliceSummary(g))
		if output == "wide" {
			line += fmt.Sprintf("\t%s\t%s\t%s", sanitize(g.ID), sanitize(g.UUID), sanitize(g.Health))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// sliceSummary is the GPU's enforcer and its slices' states, e.g.
// "mps: 2 Enforced, 1 Mismatch", or "none: 1 Unenforced".
func sliceSummary(g GPU) string {
	enforcer := sanitize(g.SliceEnforcer)
	if enforcer == "" {
		enforcer = "none"
	}
	if len(g.Slices) == 0 {
		return enforcer
	}
	counts := map[string]int{}
	var states []string
	for _, s := range g.Slices {
		if counts[s.State] == 0 {
			states = append(states, s.State)
		}
		counts[s.State]++
	}
	slices.Sort(states)
	parts := make([]string, len(states))
	for i, st := range states {
		parts[i] = fmt.Sprintf("%d %s", counts[st], sanitize(st))
	}
	return enforcer + ": " + strings.Join(parts, ", ")
}

// printUnverified lists the bound GPU pods whose allocation does not verify:
// kubegpu-scheduler counts no devices for them and kubegpu-crishim starts
// their containers with none.
func printUnverified(w io.Writer, pods []unverifiedPod, signed bool) error {
	if len(pods) == 0 {
		return nil
	}
	how := "the pod it names and its node"
	if signed {
		how = "the key given, the pod it names and its node"
	}
	fmt.Fprintf(w, "\nNot counted: %d bound GPU pod(s) whose allocation does not verify (against %s); they hold no GPUs:\n", len(pods), how)
	for _, p := range pods {
		fmt.Fprintf(w, "  %s/%s on %s: %s\n", p.pod.Namespace, p.pod.Name, p.pod.Spec.NodeName, sanitize(p.reason))
	}
	return nil
}
