package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/plugins/simgpu"
	"github.com/kubegpu/kubegpu/types"
)

// heapResult is one scheduler's heap across the adversarial pods.
type heapResult struct {
	scheduler           string
	before, peak, after float64
	took                time.Duration
}

// runMemory creates and deletes o.adversarial adversarial GPU pods, in
// waves the nodes can hold, through the stock kube-scheduler and then
// kubegpu-scheduler, and reports each one's heap (after a forced GC)
// before, at the peak and after: the stock scheduler's is the baseline of
// what the API objects alone cost a scheduler.
func runMemory(ctx context.Context, c *localcluster.Cluster, o options, dir, keyFile string) error {
	var results []heapResult
	for _, sched := range []string{"kube-scheduler", "kubegpu-scheduler"} {
		r, err := runMemoryOnce(ctx, c, o, dir, keyFile, sched)
		if err != nil {
			return fmt.Errorf("%s: %w", sched, err)
		}
		results = append(results, r)
	}
	wave := min(o.adversarial, o.nodes*8*100/16/2)
	fmt.Printf("Scheduler heap (live, after a forced GC): %d adversarial GPU pods (16 containers, every model and UUID list at its limit, a shape each) created, scheduled and deleted in waves of %d on %d nodes (%s)\n\n",
		o.adversarial, wave, o.nodes, o.preset)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scheduler\tbefore MiB\tpeak MiB\tafter MiB\tafter - before MiB\tseconds\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%+.1f\t%.0f\t\n", r.scheduler, r.before/(1<<20), r.peak/(1<<20), r.after/(1<<20), (r.after-r.before)/(1<<20), r.took.Seconds())
	}
	tw.Flush()
	stock, ours := results[0], results[1]
	fmt.Printf("\nkubegpu-scheduler keeps %+.1f MiB more than the stock scheduler after the pods went\n", ((ours.after-ours.before)-(stock.after-stock.before))/(1<<20))
	return nil
}

func runMemoryOnce(ctx context.Context, c *localcluster.Cluster, o options, dir, keyFile, sched string) (heapResult, error) {
	topo, err := simgpu.Preset(o.preset)
	if err != nil {
		return heapResult{}, err
	}
	s, err := startScheduler(ctx, c, o, dir, keyFile, sched)
	if err != nil {
		return heapResult{}, err
	}
	defer func() { _ = s.Stop() }()
	ns := "adversarial-" + sched
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return heapResult{}, err
	}
	heap := func() (float64, error) { return schedulerHeap(ctx, schedulerPort, "") }
	// Let it sync and settle before the baseline.
	time.Sleep(10 * time.Second)
	before, err := heap()
	if err != nil {
		return heapResult{}, err
	}
	// Each wave fills at most half of the GPUs: every pod has 16 slices
	// of 1%.
	wave := min(o.adversarial, o.nodes*8*100/16/2)
	var peak float64
	start := time.Now()
	for done := 0; done < o.adversarial; done += wave {
		n := min(wave, o.adversarial-done)
		fmt.Fprintf(os.Stderr, "schedbench: %s, adversarial pods %d..%d\n", sched, done, done+n)
		if err := createAll(ctx, c, ns, n, func(i int) *corev1.Pod { return adversarialPod(done+i, topo.Model) }); err != nil {
			return heapResult{}, err
		}
		if err := waitBound(ctx, c, ns); err != nil {
			return heapResult{}, err
		}
		if h, err := heap(); err == nil {
			peak = max(peak, h)
		}
		if err := deleteAll(ctx, c, ns); err != nil {
			return heapResult{}, err
		}
	}
	// The scheduler sees the deletions through its informers.
	time.Sleep(5 * time.Second)
	save := ""
	if o.keep {
		// The heap's profile, for go tool pprof.
		save = filepath.Join(dir, sched+"-heap-after.pprof")
	}
	after, err := schedulerHeap(ctx, schedulerPort, save)
	if err != nil {
		return heapResult{}, err
	}
	return heapResult{scheduler: sched, before: before, peak: peak, after: after, took: time.Since(start)}, nil
}

// schedulerPort is the secure port of the scheduler started last.
var schedulerPort int

// adversarialPod is the largest pod the request limits accept, each of a
// shape of its own: 16 containers, every model and UUID list at its limit of
// characters and entries, distinct per pod, and a CPU request of its own.
func adversarialPod(i int, model string) *corev1.Pod {
	list := func(prefix string, first string) string {
		entries := []string{}
		if first != "" {
			entries = append(entries, first)
		}
		width := (objects.MaxListChars+1)/objects.MaxListEntries - 1
		for k := len(entries); k < objects.MaxListEntries; k++ {
			e := fmt.Sprintf("%s%d-%02d-", prefix, i, k)
			entries = append(entries, e+strings.Repeat("x", max(0, width-len(e))))
		}
		s := strings.Join(entries, ",")
		return s[:min(len(s), objects.MaxListChars)]
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("a-%05d", i), Annotations: map[string]string{
		kubeinterface.AnnotationModelInclude: list("m", model), kubeinterface.AnnotationModelExclude: list("n", ""),
		kubeinterface.AnnotationUUIDExclude: list("u", ""),
	}}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](1)}}
	for k := range types.MaxDeviceContainers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprint("c", k), Image: "busybox",
			Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1"), kubeinterface.ResourceGPUCores: resource.MustParse("1")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(int64(1+i%97), resource.DecimalSI),
					corev1.ResourceMemory: resource.MustParse("1Mi")},
			}})
	}
	return p
}

func createAll(ctx context.Context, c *localcluster.Cluster, ns string, n int, pod func(int) *corev1.Pod) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod(i), metav1.CreateOptions{})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// waitBound waits until no pod of ns is left unbound; it lists at most one
// pod at a time, as the pods are large.
func waitBound(ctx context.Context, c *localcluster.Cluster, ns string) error {
	return wait.PollUntilContextTimeout(ctx, 2*time.Second, 20*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=", Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	})
}

func deleteAll(ctx context.Context, c *localcluster.Cluster, ns string) error {
	if err := c.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	})
}

// schedulerHeap forces a garbage collection in the scheduler (through its
// heap profile endpoint, saved to save if not empty) and reads its live
// heap from /metrics.
func schedulerHeap(ctx context.Context, port int, save string) (float64, error) {
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed
	get := func(path string) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", port, path), nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return resp.Body, nil
	}
	body, err := get("/debug/pprof/heap?gc=1")
	if err != nil {
		return 0, err
	}
	sink := io.Discard
	if save != "" {
		f, err := os.Create(save)
		if err != nil {
			body.Close()
			return 0, err
		}
		defer f.Close()
		sink = f
	}
	_, err = io.Copy(sink, body)
	body.Close()
	if err != nil {
		return 0, err
	}
	if body, err = get("/metrics"); err != nil {
		return 0, err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_alloc_bytes "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no go_memstats_heap_alloc_bytes in the scheduler's /metrics")
}
