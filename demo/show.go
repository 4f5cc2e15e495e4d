package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// What the demo shows of a pod on the real node: its container's output,
// its allocation, and its claim's.

// showEnv waits for the pod on the real node to finish and prints its
// container's output, as kubectl logs gets it.
func showEnv(ctx context.Context, c *localcluster.Identity, name string) error {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		phase := corev1.PodPhase("unknown")
		if pod != nil {
			phase = pod.Status.Phase
		}
		return fmt.Errorf("pod %s did not finish (phase %s): %w", name, phase, err)
	}
	fmt.Printf("    pod/%s on %s: %s, allocation %s\n", name, pod.Spec.NodeName, pod.Status.Phase, allocationSummary(pod))
	// As kubectl logs reads them: the API server asks the node's kubelet,
	// which reads them through the shim.
	logs, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("the logs of pod %s (kubectl logs): %w", name, err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(logs)), "\n") {
		fmt.Println("    " + l)
	}
	return nil
}

func allocationSummary(p *corev1.Pod) string {
	a, err := objects.PodAllocation(p)
	if err != nil {
		return "none"
	}
	var uuids []string
	for _, c := range a.Containers {
		for _, d := range c.Devices {
			uuids = append(uuids, d.ID+"="+d.UUID)
		}
	}
	return strings.Join(uuids, ", ")
}

// showRunningEnv prints what a running pod's container printed, once it
// has printed its GPUs, as kubectl logs shows it to the tenant.
func showRunningEnv(ctx context.Context, c *localcluster.Identity, name string) error {
	var logs []byte
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		logs, err = c.Client.CoreV1().Pods(metav1.NamespaceDefault).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && strings.Contains(string(logs), "SIMGPU"), nil
	})
	if err != nil {
		return fmt.Errorf("pod %s printed no GPUs (kubectl logs): %w", name, err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(logs)), "\n") {
		fmt.Println("    " + l)
	}
	return nil
}

// showClaim prints a claim's standard allocation, as `kubectl describe
// resourceclaim` shows it to the tenant.
func showClaim(ctx context.Context, tenant *localcluster.Identity, name string) error {
	c, err := tenant.Client.ResourceV1().ResourceClaims(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if c.Status.Allocation == nil {
		return fmt.Errorf("ResourceClaim %s is not allocated", name)
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		fmt.Printf("    resourceclaim/%s: request %s -> %s/%s/%s\n", name, r.Request, r.Driver, r.Pool, r.Device)
	}
	if _, _, err := dra.SignedValue(c.Status.Allocation); err != nil {
		return fmt.Errorf("ResourceClaim %s: %w", name, err)
	}
	fmt.Printf("    resourceclaim/%s: signed by kubegpu-scheduler (status.allocation.devices.config, driver %s)\n", name, dra.DriverName)
	return nil
}
