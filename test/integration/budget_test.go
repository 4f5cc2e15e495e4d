package integration

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// budget gives namespace ns a GPU budget of share per cent of a GPU, as an
// operator does (scoped as the docs say unless scope is false), and waits
// until the quota controller has counted it.
func budget(ctx context.Context, t *testing.T, ns string, share int64, scoped bool) {
	t.Helper()
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: kubeinterface.BudgetQuota},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
			"requests." + kubeinterface.ResourceGPUShare: *resource.NewQuantity(share, resource.DecimalSI)}},
	}
	if scoped {
		q.Spec.ScopeSelector = &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
			ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpNotIn,
			Values: []string{kubeinterface.PriorityClassBorrowed}}}}
	}
	if _, err := cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBudgetUsed(ctx, t, ns, 0)
	if !scoped {
		return
	}
	// The API server's policies read the quota from a cache of their own:
	// wait until a pod over the whole budget borrows.
	probe := gpuPod("probe", int(share/100)+1, 0, 0, nil)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && p.Spec.PriorityClassName == kubeinterface.PriorityClassBorrowed, nil
	}); err != nil {
		t.Fatalf("the budget of %s is not in force: %v", ns, err)
	}
}

// waitBudgetUsed waits until ns's budget quota counts used per cent of a
// GPU as used.
func waitBudgetUsed(ctx context.Context, t *testing.T, ns string, used int64) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		q, err := cluster.Client.CoreV1().ResourceQuotas(ns).Get(ctx, kubeinterface.BudgetQuota, metav1.GetOptions{})
		if err != nil || q.Status.Hard == nil {
			return false, nil
		}
		u := q.Status.Used["requests."+kubeinterface.ResourceGPUShare]
		return u.Value() == used, nil
	}); err != nil {
		t.Fatalf("budget of %s never counted %d used: %v", ns, used, err)
	}
}

// TestBudgetBorrows: a namespace over its GPU budget still runs a GPU pod
// on idle GPUs, at the borrowers' priority whatever PriorityClass the
// tenant asked for, and that pod is the one preempted when a namespace
// within its budget needs the GPUs, although evicting the first
// namespace's pods within budget would do too; those stay. `kubegpu gpus`
// and `kubegpu explain` show the borrower and whether its budget has room.
// Under a budget, memory-only slices are refused; a pod naming the
// borrowers' class anywhere gets at most their grace; a budget quota not
// shaped as documented refuses GPU pods with a message that says so.
func TestBudgetBorrows(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	addNodes(ctx, t, "budget", "dgx1", 1)
	priorityClass(ctx, t, "kubegpu-test-budget-high", 1000)
	a, b := namespace(ctx, t, "budget-a"), namespace(ctx, t, "budget-b")
	finishing := &atomic.Bool{}
	finishing.Store(true)
	for _, ns := range []string{a, b} {
		finishTerminating(ctx, t, ns, finishing)
	}
	budget(ctx, t, a, 400, true)
	budget(ctx, t, b, 800, true)
	onNode := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "budget-0"}
		return p
	}

	// Within a's budget of 4 GPUs: two pods of 2.
	createPods(ctx, t, a, onNode(gpuPod("a-0", 2, 0, 0, nil)), onNode(gpuPod("a-1", 2, 0, 0, nil)))
	waitBudgetUsed(ctx, t, a, 400)
	for _, name := range []string{"a-0", "a-1"} {
		if p := boundPod(ctx, t, a, name); p.Spec.PriorityClassName != "" {
			t.Errorf("pod %s within its budget got PriorityClass %q", name, p.Spec.PriorityClassName)
		}
	}
	// Over it, whatever class the tenant asks for: borrows the idle quad.
	over := onNode(gpuPod("a-over", 4, 0, 0, nil))
	over.Spec.PriorityClassName = "kubegpu-test-budget-high"
	over.Spec.TerminationGracePeriodSeconds = ptr.To[int64](86400) // held a day after eviction, if it could
	createPods(ctx, t, a, over)
	p := boundPod(ctx, t, a, "a-over")
	if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != kubeinterface.BorrowedGracePeriodSeconds {
		t.Errorf("borrower's grace period %v, want capped to %d", g, kubeinterface.BorrowedGracePeriodSeconds)
	}
	if p.Spec.PriorityClassName != kubeinterface.PriorityClassBorrowed || p.Spec.Priority == nil || *p.Spec.Priority != kubeinterface.BorrowedPriority ||
		p.Spec.PreemptionPolicy == nil || *p.Spec.PreemptionPolicy != corev1.PreemptNever {
		t.Fatalf("pod over its budget: PriorityClass %q priority %v preemption %v, want %s %d Never",
			p.Spec.PriorityClassName, p.Spec.Priority, p.Spec.PreemptionPolicy, kubeinterface.PriorityClassBorrowed, kubeinterface.BorrowedPriority)
	}
	if out := kubegpu(t, "gpus"); !strings.Contains(out, a+"/a-over (borrowing)") || strings.Contains(out, a+"/a-0 (borrowing)") {
		t.Errorf("kubegpu gpus does not show the borrower alone as borrowing:\n%s", out)
	}
	if out := kubegpu(t, "explain", "-n", a, "a-over"); !strings.Contains(out, "It borrows") || !strings.Contains(out, "budget has no room for it now (400 of 400") {
		t.Errorf("kubegpu explain does not say the pod borrows with no room in its budget:\n%s", out)
	}

	// b, within its budget, needs the quad at a priority above all of a's
	// pods: evicting a-0 and a-1 would free a quad too, but the borrower
	// goes and a's pods within budget stay.
	inBudget := onNode(gpuPod("b-0", 4, 0, 0, nil))
	inBudget.Spec.PriorityClassName = "kubegpu-test-budget-high"
	createPods(ctx, t, b, inBudget)
	boundPod(ctx, t, b, "b-0")
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := viewer.Client.CoreV1().Pods(a).Get(ctx, "a-over", metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Error("the borrower was not evicted for the pod within its budget")
	}
	for _, name := range []string{"a-0", "a-1"} {
		if p, err := viewer.Client.CoreV1().Pods(a).Get(ctx, name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
			t.Errorf("pod %s within its budget was evicted (%v)", name, err)
		}
	}

	// A borrower in a namespace whose budget has room again: explain says
	// that, re-created, it would run within budget.
	if err := tenant(t, a).CoreV1().Pods(a).Delete(ctx, "a-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBudgetUsed(ctx, t, a, 200)
	late := onNode(gpuPod("a-late", 1, 0, 0, nil))
	late.Spec.PriorityClassName = kubeinterface.PriorityClassBorrowed
	createPods(ctx, t, a, late)
	boundPod(ctx, t, a, "a-late")
	if out := kubegpu(t, "explain", "-n", a, "a-late"); !strings.Contains(out, "budget has room for it now (200 of 400") {
		t.Errorf("kubegpu explain does not say the borrower's budget has room:\n%s", out)
	}

	// Under a budget, slices of memory only (worth nothing to it) are
	// refused rather than run within it at any size.
	_, err := tenant(t, b).CoreV1().Pods(b).Create(ctx, gpuPod("memory-only", 1, 0, 1024, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a memory-only slice under a budget", err, "GPU slices of memory only", kubeinterface.ResourceGPUCores)

	// A pod naming the borrowers' class where no budget exists keeps at
	// most the borrowers' grace: a preemptor evicting it waits no longer.
	free := namespace(ctx, t, "budget-free")
	named := gpuPod("named", 1, 0, 0, nil)
	named.Spec.PriorityClassName = kubeinterface.PriorityClassBorrowed
	named.Spec.TerminationGracePeriodSeconds = ptr.To[int64](86400)
	if p, err := tenant(t, free).CoreV1().Pods(free).Create(ctx, named, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a pod naming %s: %v", kubeinterface.PriorityClassBorrowed, err)
	} else if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != kubeinterface.BorrowedGracePeriodSeconds {
		t.Errorf("a pod naming %s outside any budget keeps %v s of grace, want %d", kubeinterface.PriorityClassBorrowed, g, kubeinterface.BorrowedGracePeriodSeconds)
	}

	// A budget that would count borrowers refuses them with the cause.
	c := namespace(ctx, t, "budget-c")
	budget(ctx, t, c, 100, false)
	_, err = tenant(t, c).CoreV1().Pods(c).Create(ctx, gpuPod("any", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a GPU pod under an unscoped budget", err, kubeinterface.BudgetQuota, "must be scoped to pods not of PriorityClass "+kubeinterface.PriorityClassBorrowed)

	// So does a budget that limits more than GPU shares: its other limits
	// would refuse the pods it should let borrow.
	e := namespace(ctx, t, "budget-e")
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: kubeinterface.BudgetQuota}, Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{"requests." + kubeinterface.ResourceGPUShare: resource.MustParse("100"), corev1.ResourcePods: resource.MustParse("10")},
		ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
			ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpNotIn, Values: []string{kubeinterface.PriorityClassBorrowed}}}}}}
	if _, err := cluster.Client.CoreV1().ResourceQuotas(e).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBudgetUsed(ctx, t, e, 0)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err = tenant(t, e).CoreV1().Pods(e).Create(ctx, gpuPod("any", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "and nothing else"), nil
	}); err != nil {
		t.Errorf("a GPU pod under a budget that also limits pods: %v, want refused with the cause", err)
	}

	// So does a budget the policy cannot count in (not a whole number).
	d := namespace(ctx, t, "budget-d")
	q = &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: kubeinterface.BudgetQuota}, Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{"requests." + kubeinterface.ResourceGPUShare: resource.MustParse("1500m")},
		ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
			ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpNotIn, Values: []string{kubeinterface.PriorityClassBorrowed}}}}}}
	if _, err := cluster.Client.CoreV1().ResourceQuotas(d).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBudgetUsed(ctx, t, d, 0)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err = tenant(t, d).CoreV1().Pods(d).Create(ctx, gpuPod("any", 1, 0, 0, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "whole number"), nil
	}); err != nil {
		t.Errorf("a GPU pod under a budget of 1500m: %v, want refused with the cause", err)
	}
}
