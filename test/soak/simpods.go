package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// simKubelets do for the pods of the simulated nodes the little a kubelet
// does that the scheduler depends on: a pod being deleted is removed once
// its (never started) containers are "stopped", and a Job's pods succeed
// when the churn ends them. They act as cluster-admin: the stand-in's
// credentials are not what is under test.
type simKubelets struct {
	s   *soak
	chk *checker
}

// run removes the deleted pods of simulated nodes every second.
func (k *simKubelets) run(ctx context.Context) {
	every(ctx, time.Second, func() {
		for _, p := range k.chk.podsNow() {
			if p.DeletionTimestamp == nil || p.Spec.NodeName == "" || k.s.simNode(p.Spec.NodeName) == nil {
				continue
			}
			err := k.s.cluster.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
				GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil && !isOutage(err) {
				logf("simulated kubelet: remove pod %s: %v", p.Name, err)
			}
		}
	})
}

// errJobRunning is returned by succeedJob while the Job is still there:
// the churn asks again, since the Job controller may have replaced a pod
// (one preempted, say) after the others succeeded.
var errJobRunning = errors.New("the Job is still there")

// succeedJob ends a Job: when all its pods are bound, they succeed (and
// the Job completes; its TTL deletes it); otherwise the Job is deleted.
// It returns errJobRunning until the Job is gone.
func (k *simKubelets) succeedJob(ctx context.Context, job string) error {
	client := k.s.cluster.Client
	if _, err := client.BatchV1().Jobs(soakNamespace).Get(ctx, job, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	pods, err := client.CoreV1().Pods(soakNamespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		return err
	}
	bound := len(pods.Items) > 0
	for _, p := range pods.Items {
		bound = bound && p.Spec.NodeName != ""
	}
	if !bound {
		err := client.BatchV1().Jobs(soakNamespace).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return errJobRunning
	}
	now := metav1.Now()
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}}}}
		if _, err := client.CoreV1().Pods(soakNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("pod %s succeeds: %w", p.Name, err)
		}
	}
	return errJobRunning
}
