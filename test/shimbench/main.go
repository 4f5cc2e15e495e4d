// Command shimbench measures the latency kubegpu-crishim adds to CRI calls:
// it starts a real containerd (internal/localnode) and the shim in front of
// it, creates a pod sandbox with CONTAINERS containers, and times Version,
// ContainerStatus and ListContainers made directly to containerd and
// through the shim, alternating, printing p50/p99 and their ratios.
//
//	go run ./test/shimbench --bin-dir _output/bin --plugin-dir _output/plugins --node-bin-dir _output/tools/bin
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
)

type options struct {
	binDir, pluginDir, nodeBinDir string
	containers, calls             int
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "_output/bin", "kubegpu-crishim")
	flag.StringVar(&o.pluginDir, "plugin-dir", "_output/plugins", "device modules")
	flag.StringVar(&o.nodeBinDir, "node-bin-dir", "_output/tools/bin", "containerd, ctr and crictl")
	flag.IntVar(&o.containers, "containers", 200, "containers in the sandbox")
	flag.IntVar(&o.calls, "calls", 2000, "calls per method and endpoint")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "shimbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "kg-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	n, err := localnode.Start(ctx, localnode.Options{Dir: dir, BinDir: o.nodeBinDir})
	if err != nil {
		return err
	}
	defer func() { _ = n.Stop() }()
	archive := filepath.Join(dir, "busybox.tar")
	if err := localnode.WriteImageArchive(archive, localnode.ImageSpec{Names: []string{"docker.io/library/busybox:latest"}}); err != nil {
		return err
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		return err
	}
	_, key, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "crishim.sock")
	// Metrics on, as the systemd unit has them, and scraped before the
	// memory is read.
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	metricsAddr := ml.Addr().String()
	ml.Close()
	shim, err := localcluster.StartProcess(filepath.Join(dir, "kubegpu-crishim.log"), filepath.Join(o.binDir, "kubegpu-crishim"),
		"--node-name=bench", "--plugin-dir="+o.pluginDir, "--plugin-option=simgpu.preset=t4x4", "--listen="+sock,
		"--runtime-endpoint="+n.Endpoint(), "--allocation-key="+key, "--advertise=false", "--metrics-bind-address="+metricsAddr)
	if err != nil {
		return err
	}
	defer func() { _ = shim.Stop() }()
	if err := shim.WaitFor(ctx, 30*time.Second, func(context.Context) error { _, err := os.Stat(sock); return err }); err != nil {
		return err
	}

	direct, err := dial(n.Socket)
	if err != nil {
		return err
	}
	proxied, err := dial(sock)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "shimbench: creating a sandbox with %d containers\n", o.containers)
	first, err := setup(ctx, proxied, dir, o.containers)
	if err != nil {
		return err
	}
	calls := []struct {
		name string
		call func(runtimeapi.RuntimeServiceClient) error
	}{
		{"Version", func(c runtimeapi.RuntimeServiceClient) error {
			_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"ContainerStatus", func(c runtimeapi.RuntimeServiceClient) error {
			_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: first})
			return err
		}},
		{fmt.Sprintf("ListContainers (%d)", o.containers), func(c runtimeapi.RuntimeServiceClient) error {
			_, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			return err
		}},
	}
	fmt.Printf("CRI call latency, containerd 2.4.2 direct vs through kubegpu-crishim, %d calls each, alternating\n\n", o.calls)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "call\tdirect p50\tshim p50\tadded p50\tdirect p99\tshim p99\tratio p50\t")
	for _, c := range calls {
		var d, s []time.Duration
		for i := 0; i < o.calls; i++ {
			for _, target := range []struct {
				client runtimeapi.RuntimeServiceClient
				out    *[]time.Duration
			}{{direct, &d}, {proxied, &s}} {
				start := time.Now()
				if err := c.call(target.client); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				*target.out = append(*target.out, time.Since(start))
			}
		}
		dp50, sp50 := pct(d, 50), pct(s, 50)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.2fx\t\n", c.name, us(dp50), us(sp50), us(sp50-dp50), us(pct(d, 99)), us(pct(s, 99)), float64(sp50)/float64(dp50))
	}
	tw.Flush()
	if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	} else {
		return fmt.Errorf("scrape the shim's metrics: %w", err)
	}
	rss, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", shimPID(shim)))
	if err == nil {
		for _, l := range strings.Split(string(rss), "\n") {
			if strings.HasPrefix(l, "VmRSS") || strings.HasPrefix(l, "RssAnon") || strings.HasPrefix(l, "RssFile") {
				fmt.Printf("kubegpu-crishim %s\n", strings.Join(strings.Fields(l), " "))
			}
		}
	}
	return nil
}

func shimPID(p *localcluster.Process) int { return p.Pid() }

func dial(sock string) (runtimeapi.RuntimeServiceClient, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), nil
}

// setup creates a sandbox and n containers in it (created, not started)
// and returns the first container's ID.
func setup(ctx context.Context, c runtimeapi.RuntimeServiceClient, dir string, n int) (string, error) {
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "bench", Namespace: "bench", Uid: "bench-uid"},
		LogDirectory: filepath.Join(dir, "logs"),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	pod, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sb})
	if err != nil {
		return "", fmt.Errorf("run sandbox: %w", err)
	}
	var first string
	for i := 0; i < n; i++ {
		r, err := c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, SandboxConfig: sb,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("c%03d", i)},
				Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
				Command:  []string{"sleep", "3600"},
				LogPath:  fmt.Sprintf("c%03d.log", i),
				Linux:    &runtimeapi.LinuxContainerConfig{},
			}})
		if err != nil {
			return "", fmt.Errorf("create container %d: %w", i, err)
		}
		if first == "" {
			first = r.ContainerId
		}
	}
	return first, nil
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d.Microseconds())) }
