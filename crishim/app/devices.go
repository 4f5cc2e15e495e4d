package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/crishim/nodeplugins"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
	"github.com/kubegpu/kubegpu/utils/pluginload"
)

// pluginOptions are the flags every command that starts device modules takes.
type pluginOptions struct {
	PluginDir string
	NodeName  string
	Options   []string
	Pins      []string
}

func (o *pluginOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.PluginDir, "plugin-dir", "/usr/lib/kubegpu/plugins", "directory of device module .so files")
	cmd.Flags().StringVar(&o.NodeName, "node-name", defaultNodeName(), "name of this node in Kubernetes")
	cmd.Flags().StringArrayVar(&o.Options, "plugin-option", nil, "a device module's option as MODULE.KEY=VALUE, e.g. simgpu.preset=dgx1 (repeatable)")
	cmd.Flags().StringArrayVar(&o.Pins, "plugin-sha256", nil, "pin a module file to its SHA-256 as FILE.so=DIGEST (sha256sum); with any pin, every module must be pinned (repeatable)")
}

// open loads the device modules: those that started, and a failure for
// each that did not (see nodeplugins.Open).
func (o *pluginOptions) open(ctx context.Context) ([]nodeplugins.Plugin, []nodeplugins.Failure) {
	pins, err := pluginload.ParsePins(o.Pins)
	if err != nil {
		return nil, []nodeplugins.Failure{{Module: o.PluginDir, Err: err}}
	}
	return nodeplugins.Open(ctx, o.PluginDir, o.NodeName, o.Options, pins)
}

type devicesOptions struct {
	pluginOptions
	Output string
}

func newDevicesCommand() *cobra.Command {
	o := &devicesOptions{}
	cmd := &cobra.Command{
		Use:   "devices",
		Short: "Discover this node's devices through the device modules and print them",
		Long: `Loads every device module in --plugin-dir, discovers this node's devices
and prints them with the link matrix between them: what the advertiser
would publish. A module with no devices on this node (e.g. nvidia without
the NVIDIA driver) is skipped with a log line that says why. Exits non-zero
if a module fails to load, to start or to discover.`,
		Example: `  kubegpu-crishim devices --plugin-dir _output/plugins --plugin-option simgpu.preset=dgx1`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVarP(&o.Output, "output", "o", "table", "output format: table, json, or resourceslice (the devices as the node's ResourceSlices publish them, JSON)")
	return cmd
}

func (o *devicesOptions) run(cmd *cobra.Command) error {
	if o.Output != "table" && o.Output != "json" && o.Output != "resourceslice" {
		return fmt.Errorf("--output must be table, json or resourceslice, got %q", o.Output)
	}
	ctx := cmd.Context()
	plugins, failures := o.open(ctx)
	openErr := nodeplugins.Errors(failures)
	defer func() {
		if err := nodeplugins.Close(plugins); err != nil {
			klog.FromContext(ctx).Error(err, "Closing device modules")
		}
	}()

	type result struct {
		Module    string          `json:"module"`
		Inventory types.Inventory `json:"inventory"`
	}
	var (
		results []result
		errs    = []error{openErr}
	)
	for _, p := range plugins {
		inv, err := p.Discover(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("device module %s: discover: %w", p.Module, err))
			continue
		}
		if err := inv.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("device module %s: discover: %w", p.Module, err))
			continue
		}
		results = append(results, result{Module: p.Module, Inventory: inv})
	}

	out := cmd.OutOrStdout()
	switch o.Output {
	case "resourceslice":
		var invs []types.Inventory
		for _, r := range results {
			invs = append(invs, r.Inventory)
		}
		merged, err := advertiser.MergeInventories(invs...)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		devices, err := dra.Devices(merged, dra.Options{PCIeRoot: pcieRoot})
		if err != nil {
			errs = append(errs, fmt.Errorf("ResourceSlice devices: %w", err))
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(devices); err != nil {
			return err
		}
		return errors.Join(errs...)
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	default:
		if len(plugins) == 0 && openErr == nil {
			fmt.Fprintf(out, "No device modules in %s.\n", o.PluginDir)
		}
		for _, r := range results {
			if err := printInventory(out, r.Module, r.Inventory); err != nil {
				return err
			}
		}
	}
	return errors.Join(errs...)
}

// printInventory prints the devices as a table and the links as nvidia-smi
// topo -m does.
func printInventory(w io.Writer, module string, inv types.Inventory) error {
	var served []string
	for _, d := range inv.Devices {
		if !slices.Contains(served, d.ServedAs()) {
			served = append(served, d.ServedAs())
		}
	}
	fmt.Fprintf(w, "Module %s: %d devices", module, len(inv.Devices))
	if len(served) > 0 {
		fmt.Fprintf(w, ", asked for as %s", strings.Join(served, ", "))
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tID\tUUID\tMODEL\tMEMORY\tSMS\tNUMA\tPCI\tHEALTH")
	for _, d := range inv.Devices {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d MiB\t%d\t%d\t%s\t%s\n",
			d.Index, d.ID, d.UUID, d.Model, d.MemoryMiB, d.ComputeUnits, d.NUMANode, d.PCIBusID, d.Health)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(inv.Devices) < 2 {
		fmt.Fprintln(w)
		return nil
	}
	fmt.Fprintln(w, "\nLinks:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{""}
	for _, d := range inv.Devices {
		header = append(header, d.ID)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i, row := range inv.LinkLabels() {
		fmt.Fprintln(tw, inv.Devices[i].ID+"\t"+strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nNV# = NVLink with # links, NVS = NVSwitch, PIX = same PCIe switch, PHB = host bridge, SYS = across CPU sockets")
	if slices.ContainsFunc(inv.Links, func(l types.Link) bool { return l.Kind == types.LinkXGMI }) {
		fmt.Fprintln(w, "XGMI = AMD Infinity Fabric link, XGMI# = # XGMI hops apart")
	}
	fmt.Fprintln(w)
	return nil
}
