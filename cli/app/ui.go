package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/cli/ui"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// Pacing of the page's view: rebuilt at most every minRebuild after a
// change, and at least every maxRebuild (the pending pods' ages).
const (
	minRebuild = 250 * time.Millisecond
	maxRebuild = 10 * time.Second
)

type uiOptions struct {
	listen    string
	tokenFile string
	noToken   bool
	explain   explainOptions
	// tenant serves the namespace's view (namespace) with the capacity
	// at capacityRef.
	tenant      bool
	namespace   string
	capacityRef string
}

func newUICommand(client func() (kubernetes.Interface, error), namespace func() string, key func() (*kubeinterface.KeySet, error)) *cobra.Command {
	o := uiOptions{}
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve a live web page of the cluster's nodes, GPUs, links, pods and why pods wait",
		Long: `ui serves one page, built from what the caller's kubeconfig may read and kept
up to date from watches: per node a grid of its GPUs and the pods on each, the
links of a chosen node, cluster totals, pending GPU pods with explain's
per-node reasons, and the namespaces' GPU quotas. It prints the page's URL,
which holds a token: only who has the URL can open the page.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if o.explain.key, err = key(); err != nil {
				return err
			}
			if o.tenant {
				o.namespace = namespace()
			}
			return o.run(cmd, c)
		},
	}
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve the page on (host:port; port 0 picks a free one)")
	cmd.Flags().StringVar(&o.tokenFile, "token-file", "", "file holding the page's token; default: a new random token each start")
	cmd.Flags().BoolVar(&o.noToken, "no-token", false, "serve without a token, to everyone who reaches --listen: only behind something that authenticates (kubectl port-forward to the chart's pod)")
	cmd.Flags().StringVar(&o.explain.schedulerConfig, "scheduler-config", "", "kubegpu-scheduler's KubeSchedulerConfiguration file, for the pending pods' explanations (as kubegpu explain)")
	cmd.Flags().StringVar(&o.explain.profile, "profile", "", "with --scheduler-config, the profile whose KubeGPU args to use")
	cmd.Flags().BoolVar(&o.tenant, "tenant", false, "the namespace's view (-n, or the kubeconfig's namespace), for which its view or edit role is enough: its pods, their GPUs and why they wait, and the cluster's GPUs in aggregate")
	cmd.Flags().StringVar(&o.capacityRef, "capacity-configmap", defaultCapacity, "with --tenant, the ConfigMap (NAMESPACE/NAME) kubegpu-scheduler publishes the cluster's GPU capacity in")
	return cmd
}

func (o *uiOptions) run(cmd *cobra.Command, c kubernetes.Interface) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	logger := klog.FromContext(ctx)
	token, err := o.token()
	if err != nil {
		return err
	}
	if _, err := o.explain.args(); err != nil {
		return err // a bad --scheduler-config fails now, not at the first "why"
	}
	var w *watcher
	cfg := ui.Config{Token: token, NoToken: o.noToken}
	if o.tenant {
		// Explaining needs the nodes, which a tenant may not read: the
		// page shows what the scheduler said.
		w, err = newTenantWatcher(ctx, c, o.namespace, o.capacityRef)
	} else {
		w, err = newWatcher(ctx, c)
		cfg.Explain = func(ctx context.Context, ns, name string) (any, error) {
			eo := o.explain // each explanation its own options: args() sets some
			eo.topDevices = 3
			eo.list = w.list
			e, err := eo.explain(ctx, c, ns, name)
			if err != nil {
				return nil, err
			}
			return uiExplain(e), nil
		}
	}
	if err != nil {
		return err
	}
	srv, err := ui.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	url := "http://" + ln.Addr().String() + "/"
	if !o.noToken {
		url += "?token=" + token
	}
	fmt.Fprintf(cmd.OutOrStdout(), "kubegpu ui: open %s\n", url)
	go w.publish(ctx, srv, verifier(o.explain.key))
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	hs.RegisterOnShutdown(srv.Close)
	go func() {
		<-ctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = hs.Shutdown(sctx)
	}()
	logger.V(1).Info("Serving the page", "address", ln.Addr().String())
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve the page: %w", err)
	}
	return nil
}

// token is the page's token: from --token-file, or new.
func (o *uiOptions) token() (string, error) {
	if o.noToken {
		if o.tokenFile != "" {
			return "", errors.New("--token-file and --no-token exclude each other")
		}
		return "", nil
	}
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		t := strings.TrimSpace(string(b))
		if len(t) < 16 {
			return "", fmt.Errorf("--token-file %s: the token must have at least 16 characters", o.tokenFile)
		}
		return t, nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// uiExplanation is explain's verdict as the page shows it: the lines, the
// count of nodes per reason, and the rows, fitting nodes first, at most
// maxExplainRows.
type uiExplanation struct {
	Lines   []string       `json:"lines"`
	Judged  bool           `json:"judged"`
	Nodes   int            `json:"nodes"`
	Fits    int            `json:"fits"`
	Reasons []uiReason     `json:"reasons"`
	Rows    []uiExplainRow `json:"rows"`
}

type uiReason struct {
	Reason string `json:"reason"`
	Nodes  int    `json:"nodes"`
}

type uiExplainRow struct {
	Node    string `json:"node"`
	Fits    bool   `json:"fits"`
	Rank    int    `json:"rank,omitempty"`
	Devices string `json:"devices,omitempty"`
	Reason  string `json:"reason,omitempty"`
	DRA     bool   `json:"dra,omitempty"`
}

const maxExplainRows = 200

func uiExplain(e *explanation) uiExplanation {
	out := uiExplanation{Lines: e.lines, Judged: e.rows != nil, Nodes: len(e.rows), Reasons: []uiReason{}, Rows: []uiExplainRow{}}
	at := map[string]int{}
	for i, r := range e.rows {
		if r.fits {
			out.Fits++
		} else {
			reason := r.status
			if reason == "" {
				reason = r.reason
			}
			if j, ok := at[reason]; ok {
				out.Reasons[j].Nodes++
			} else {
				at[reason] = len(out.Reasons)
				out.Reasons = append(out.Reasons, uiReason{Reason: reason, Nodes: 1})
			}
		}
		if i < maxExplainRows {
			row := uiExplainRow{Node: r.node, Fits: r.fits, Reason: r.reason, DRA: r.dra}
			if r.fits {
				row.Rank, row.Devices = i+1, r.devices
			}
			out.Rows = append(out.Rows, row)
		}
	}
	return out
}
