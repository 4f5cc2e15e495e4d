package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/device-scheduler/sim"
	"github.com/kubegpu/kubegpu/internal/tracepods"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// podTrace is the trace's pod list the churn replays.
const podTrace = "openb_pod_list_default.csv"

// Churn shape: a workload lives minLife..maxLife; new ones arrive every
// tick while fewer than maxPending pods wait, so that the cluster stays
// full and pods queue, preempt and are placed as others end.
const (
	tick       = 250 * time.Millisecond
	minLife    = 30 * time.Second
	maxLife    = 4 * time.Minute
	maxPending = 24
	maxLive    = 900
	// maxPendingReal bounds the pods waiting for the real node.
	maxPendingReal = 3
)

// Workload kinds, drawn per arrival with these weights.
var kinds = []struct {
	name   string
	weight int
}{{"pod", 70}, {"job", 8}, {"gang", 6}, {"preemptor", 6}, {"real", 10}}

// workload is what one arrival created: pods (by name), or a Job, or a
// gang's PodGroup and pods; it ends at deadline.
type workload struct {
	kind     string
	pods     []string
	job      string
	group    string
	deadline time.Time
}

// churn replays the trace's pods as workloads of every kind, as the tenant.
type churn struct {
	s     *soak
	chk   *checker
	rng   *rand.Rand
	trace []sim.PodSpec
	next  int

	mu      sync.Mutex
	live    []*workload
	created map[string]int // by kind
	errors  int
}

func newChurn(s *soak, chk *checker) *churn {
	return &churn{s: s, chk: chk, rng: rand.New(rand.NewPCG(uint64(s.o.seed), 2)), created: map[string]int{}}
}

func (c *churn) run(ctx context.Context) error {
	trace, err := sim.ReadPods(filepath.Join(c.s.o.openb, podTrace))
	if err != nil {
		return err
	}
	c.rng.Shuffle(len(trace), func(i, j int) { trace[i], trace[j] = trace[j], trace[i] })
	c.trace = trace
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		c.expire(ctx, time.Now())
		if c.chk.pendingPods() >= maxPending || c.liveCount() >= maxLive {
			continue
		}
		if err := c.arrive(ctx); err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.errors++
			c.mu.Unlock()
			// The API server may be down (a fault): the next tick tries again.
			if !isOutage(err) {
				logf("churn: %v", err)
			}
		}
	}
}

func (c *churn) liveCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

// arrive creates one workload of a kind drawn by weight.
func (c *churn) arrive(ctx context.Context) error {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := c.rng.IntN(total)
	kind := kinds[0].name
	for _, k := range kinds {
		if n < k.weight {
			kind = k.name
			break
		}
		n -= k.weight
	}
	if kind == "real" && c.chk.pendingOn(realNode) >= maxPendingReal {
		// The real node's four GPUs have a queue already: the draw
		// goes to the trace instead.
		kind = "pod"
	}
	life := minLife + time.Duration(c.rng.Int64N(int64(maxLife-minLife)))
	w := &workload{kind: kind, deadline: time.Now().Add(life)}
	id := c.next
	c.next++
	var err error
	switch kind {
	case "pod":
		err = c.createPod(ctx, w, c.tracePod(fmt.Sprintf("pod-%d", id), false))
	case "preemptor":
		p := c.tracePod(fmt.Sprintf("high-%d", id), true)
		p.Spec.PriorityClassName = highPriority
		err = c.createPod(ctx, w, p)
	case "real":
		err = c.createPod(ctx, w, c.realPod(fmt.Sprintf("real-%d", id)))
	case "job":
		err = c.createJob(ctx, w, fmt.Sprintf("job-%d", id))
	case "gang":
		err = c.createGang(ctx, w, fmt.Sprintf("gang-%d", id))
	}
	// A create that failed may still have happened (the API server
	// stopped before answering): whatever was asked for is ended at the
	// deadline like the rest, a delete of what is not there being a no-op.
	c.mu.Lock()
	if len(w.pods) > 0 || w.job != "" || w.group != "" {
		c.live = append(c.live, w)
	}
	if err == nil {
		c.created[kind]++
	}
	c.mu.Unlock()
	return err
}

// tracePod is the next trace pod, on the simulated nodes; whole GPUs
// only when whole.
func (c *churn) tracePod(name string, whole bool) *corev1.Pod {
	var p sim.PodSpec
	for {
		p = c.trace[c.next%len(c.trace)]
		c.next++
		if !whole || (p.NumGPU > 0 && p.GPUMilli == 1000) {
			break
		}
	}
	pod := tracepods.Host(&p, name)
	pod.Spec.NodeSelector = map[string]string{simLabel: "true"}
	tracepods.AskGPUs(pod, &p)
	return pod
}

// realPod runs busybox on the real node with one simulated T4 or a slice
// of one.
func (c *churn) realPod(name string) *corev1.Pod {
	limits := corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1")}
	if c.rng.IntN(2) == 0 {
		limits[kubeinterface.ResourceGPUCores] = resource.MustParse("30")
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: realNode},
			Tolerations:                   []corev1.Toleration{{Key: realNodeTaint, Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{Name: "main", Image: "docker.io/library/busybox:latest", ImagePullPolicy: corev1.PullNever,
				Command: []string{"sleep", "3600"},
				Resources: corev1.ResourceRequirements{Limits: limits,
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}},
		},
	}
}

func (c *churn) createPod(ctx context.Context, w *workload, p *corev1.Pod) error {
	w.pods = append(w.pods, p.Name)
	if _, err := c.s.tenant.Client.CoreV1().Pods(soakNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	return nil
}

// createJob creates a Job of two whole-GPU trace pods; at its deadline its
// pods succeed (the simulated kubelet's part) and the Job completes.
func (c *churn) createJob(ctx context.Context, w *workload, name string) error {
	tmpl := c.tracePod("", true)
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](2), Completions: ptr.To[int32](2), TTLSecondsAfterFinished: ptr.To[int32](20),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: tmpl.Annotations}, Spec: tmpl.Spec}},
	}
	w.job = name
	if _, err := c.s.tenant.Client.BatchV1().Jobs(soakNamespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create job %s: %w", name, err)
	}
	return nil
}

// createGang creates a PodGroup of 2 to 4 pods of one or two whole GPUs,
// all or none.
func (c *churn) createGang(ctx context.Context, w *workload, name string) error {
	size := 2 + c.rng.IntN(3)
	gpus := 1 + c.rng.IntN(2)
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: int32(size)}}}}
	w.group = name
	if _, err := c.s.tenant.Client.SchedulingV1beta1().PodGroups(soakNamespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod group %s: %w", name, err)
	}
	for i := range size {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
			Spec: corev1.PodSpec{
				NodeSelector:    map[string]string{simLabel: "true"},
				SchedulingGroup: &corev1.PodSchedulingGroup{PodGroupName: ptr.To(name)},
				Containers: []corev1.Container{{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{kubeinterface.ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}},
			},
		}
		if err := c.createPod(ctx, w, p); err != nil {
			return err
		}
	}
	return nil
}

// expire ends the workloads whose deadline passed: pods deleted (the
// simulated kubelets remove the bound ones), a Job's pods succeeded.
func (c *churn) expire(ctx context.Context, now time.Time) {
	c.mu.Lock()
	var due []*workload
	c.live = slices.DeleteFunc(c.live, func(w *workload) bool {
		if now.After(w.deadline) {
			due = append(due, w)
			return true
		}
		return false
	})
	c.mu.Unlock()
	for _, w := range due {
		if err := c.end(ctx, w); err != nil {
			// Try again in 5 s: the API server may be down, or a Job
			// not gone yet.
			w.deadline = now.Add(5 * time.Second)
			c.mu.Lock()
			c.live = append(c.live, w)
			c.mu.Unlock()
		}
	}
}

func (c *churn) end(ctx context.Context, w *workload) error {
	pods := c.s.tenant.Client.CoreV1().Pods(soakNamespace)
	if w.job != "" {
		return c.s.simKubelets.succeedJob(ctx, w.job)
	}
	for _, name := range w.pods {
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if w.group != "" {
		err := c.s.tenant.Client.SchedulingV1beta1().PodGroups(soakNamespace).Delete(ctx, w.group, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// drain ends every workload and waits until no pod of the soak is left.
func (c *churn) drain(ctx context.Context, chk *checker) error {
	c.mu.Lock()
	for _, w := range c.live {
		w.deadline = time.Time{}
	}
	c.mu.Unlock()
	var left int
	var leftGroups string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		c.expire(ctx, time.Now())
		// Jobs finished: deleted by their TTL; delete them now.
		_ = c.s.tenant.Client.BatchV1().Jobs(soakNamespace).DeleteCollection(ctx,
			metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}, metav1.ListOptions{})
		left = chk.podCount()
		groups, err := c.s.tenant.Client.SchedulingV1beta1().PodGroups(soakNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		if len(groups.Items) > 0 {
			leftGroups = fmt.Sprintf("; %d PodGroups (%s, ...)", len(groups.Items), groups.Items[0].Name)
		} else {
			leftGroups = ""
		}
		return left == 0 && leftGroups == "" && c.liveCount() == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d pods%s still there 5 minutes after the churn ended: %w", left, leftGroups, err)
	}
	return nil
}

// isOutage reports whether err is the API server being away, which faults
// cause and the churn waits out.
func isOutage(err error) bool {
	return apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTooManyRequests(err) || strings.Contains(err.Error(), "connection refused") ||
		strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "EOF")
}
