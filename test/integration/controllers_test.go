package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestControllersCreateGPUPods: on the production-configured cluster,
// kube-controller-manager's controllers create a tenant's GPU pods
// (Deployment, Job) through the admission policies and kubegpu-scheduler
// places them; a Deployment whose pods ask wrongly says why on its
// ReplicaSet; a ResourceQuota counts GPU pods.
func TestControllersCreateGPUPods(t *testing.T) {
	ctx := context.Background()
	startScheduler(ctx, t)
	nodes := addNodes(ctx, t, "controllers", "t4x4", 1)
	ns := namespace(ctx, t, "controllers")
	tc := tenant(t, ns)
	l := newLedger()

	template := func(app string, p *corev1.Pod) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}, Annotations: p.Annotations}, Spec: p.Spec}
	}
	deployment := func(name string, replicas int32, p *corev1.Pod) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: template(name, p)}}
	}
	if _, err := tc.AppsV1().Deployments(ns).Create(ctx, deployment("infer", 2, gpuPod("", 1, 50, 0, nil)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train"}, Spec: batchv1.JobSpec{Template: template("train", gpuPod("", 2, 0, 0, nil))}}
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := tc.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := viewer.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		return len(pods) == 3 && bound(pods) == 3, nil
	}); err != nil {
		t.Fatalf("the Deployment's and the Job's 3 pods were not all created and bound: %d pods, %d bound", len(pods), bound(pods))
	}
	checkAllocations(t, pods, nodes.invs)
	l.check(ctx, t, "pods created by controllers")

	// A Deployment whose pods ask for 150% of a GPU: the ReplicaSet
	// controller is refused with the request's fault.
	if _, err := tc.AppsV1().Deployments(ns).Create(ctx, deployment("bad", 1, gpuPod("", 1, 150, 0, nil)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var why string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := tc.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=bad"})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		for _, c := range list.Items[0].Status.Conditions {
			if c.Type == appsv1.ReplicaSetReplicaFailure {
				why = c.Message
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal("the ReplicaSet of a Deployment whose pods ask for 150% of a GPU reports no failure")
	}
	if !strings.Contains(why, `kubegpu.io/gpu-cores must be an integer 1..100 (percent of one GPU's compute), got "150"`) {
		t.Errorf("the ReplicaSet says %q, want the request's fault", why)
	}

	// Quota: kube-controller-manager tracks the namespace's use.
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: corev1.ResourceQuotaSpec{
		Hard: corev1.ResourceList{"requests." + kubeinterface.ResourceGPU: resource.MustParse("4")}}}
	if _, err := cluster.Client.CoreV1().ResourceQuotas(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		q, err := tc.CoreV1().ResourceQuotas(ns).Get(ctx, "gpus", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		used := q.Status.Used["requests."+kubeinterface.ResourceGPU]
		return used.Value() == 4, nil
	}); err != nil {
		t.Fatal("the quota does not count the namespace's 4 nvidia.com/gpu in use")
	}
	_, err := tc.CoreV1().Pods(ns).Create(ctx, gpuPod("over", 1, 0, 0, nil), metav1.CreateOptions{})
	refused(t, "a GPU pod over the namespace's quota", err, "exceeded quota")
}
