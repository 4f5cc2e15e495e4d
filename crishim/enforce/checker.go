package enforce

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
	"github.com/kubegpu/kubegpu/crishim/rewrite"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// UnprovenRounds is how many checks in a row a slice may go unproven
// under policy Required before its container is stopped.
const UnprovenRounds = 3

// maxMessageBytes bounds the condition's message.
const maxMessageBytes = 1024

// Runtime is what the checker needs of the container runtime.
type Runtime interface {
	// RunningContainers lists the running containers.
	RunningContainers(ctx context.Context) ([]*runtimeapi.Container, error)
	// ReadySandboxes lists the ready pod sandboxes, with their annotations.
	ReadySandboxes(ctx context.Context) ([]*runtimeapi.PodSandbox, error)
	// StopContainer stops a container.
	StopContainer(ctx context.Context, id string) error
}

// Pods writes what the checker records, with the node's credentials.
type Pods interface {
	// PatchPodStatus applies a strategic merge patch to a pod's status.
	PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error
	// CreateEvent creates a core/v1 Event (JSON) in namespace.
	CreateEvent(ctx context.Context, namespace string, event []byte) error
}

// Options configure a Checker.
type Options struct {
	// Node is this node's name.
	Node string
	// Rewriter verifies allocations and knows the node's modules.
	Rewriter *rewrite.Rewriter
	Runtime  Runtime
	// Pods records the result; nil to record nothing (the shim without
	// an API client).
	Pods    Pods
	Metrics *metrics.Shim
	// Interval is the time between checks.
	Interval time.Duration
	// Now is the clock (time.Now if nil).
	Now func() time.Time
}

// Checker checks the node's running slices. Check is not safe for
// concurrent use: Run calls it from one goroutine.
type Checker struct {
	o Options
	// written is the condition last written per pod UID.
	written map[string]condition
	// unproven counts the checks in a row a container's slices went
	// unproven, by container ID.
	unproven map[string]int
}

// New returns a checker.
func New(o Options) *Checker {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Checker{o: o, written: map[string]condition{}, unproven: map[string]int{}}
}

// Run checks every interval until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	t := time.NewTicker(c.o.Interval)
	defer t.Stop()
	for {
		if err := c.Check(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("GPU slice enforcement check skipped", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// state is one container's result, worst last.
type state int

const (
	enforced state = iota
	unenforced
	unproven
	mismatch
)

// metricIndex is the state's index in metrics.SliceStates.
func (s state) metricIndex() int { return [...]int{0, 3, 2, 1}[s] }

func (s state) String() string { return metrics.SliceStates[s.metricIndex()] }

func (s state) reason() string {
	return [...]string{kubeinterface.ReasonEnforced, kubeinterface.ReasonUnenforced, kubeinterface.ReasonUnproven, kubeinterface.ReasonMismatch}[s]
}

// condition is what is recorded on a pod.
type condition struct {
	status, reason, message string
}

// pod gathers one pod's containers with slices.
type pod struct {
	namespace, name, uid string
	worst                state
	lines                []string
	// warn: a Warning event is due (a mismatch, an unproven slice, a
	// container stopped); an unenforced slice under BestEffort is what
	// the policy allows, and is only recorded.
	warn bool
}

// Check runs one round: every running container with slices.
func (c *Checker) Check(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	listCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sandboxes, err := c.o.Runtime.ReadySandboxes(listCtx)
	if err != nil {
		cancel()
		return fmt.Errorf("list pod sandboxes: %w", err)
	}
	containers, err := c.o.Runtime.RunningContainers(listCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	bySandbox := make(map[string]*runtimeapi.PodSandbox, len(sandboxes))
	for _, sb := range sandboxes {
		bySandbox[sb.GetId()] = sb
	}
	pods := map[string]*pod{}
	counts := make([]int64, len(metrics.SliceStates))
	running := map[string]bool{}
	for _, ctr := range containers {
		sb := bySandbox[ctr.GetPodSandboxId()]
		if sb == nil {
			continue
		}
		md := sb.GetMetadata()
		pa, err := c.o.Rewriter.PodAllocation(&runtimeapi.PodSandboxConfig{Metadata: md, Annotations: sb.GetAnnotations()})
		if err != nil {
			continue // CreateContainer refused it its devices
		}
		name := ctr.GetMetadata().GetName()
		alloc, ok := pa.Container(name)
		if !ok || !alloc.Shared() {
			continue
		}
		running[ctr.GetId()] = true
		st, line := c.container(ctx, md.GetUid(), alloc)
		required := pa.Enforcement == types.EnforcementRequired
		warn := st == mismatch || st == unproven
		switch st {
		case mismatch:
			c.o.Metrics.EnforcementMismatches.Inc()
		case unproven:
			c.unproven[ctr.GetId()]++
		}
		if st != unproven {
			delete(c.unproven, ctr.GetId())
		}
		if required && (st == mismatch || st == unenforced || (st == unproven && c.unproven[ctr.GetId()] >= UnprovenRounds)) {
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := c.o.Runtime.StopContainer(stopCtx, ctr.GetId())
			cancel()
			if err != nil {
				logger.Error(err, "Cannot stop a container whose GPU slice is not enforced as granted", "pod", md.GetNamespace()+"/"+md.GetName(), "container", name)
			} else {
				c.o.Metrics.EnforcementStops.Inc()
				logger.Info("Stopped a container whose GPU slice is not enforced as granted (enforcement Required)", "pod", md.GetNamespace()+"/"+md.GetName(), "container", name, "state", st.String(), "detail", line)
				line += " (stopped: enforcement Required)"
				warn = true
			}
		}
		counts[st.metricIndex()]++
		p := pods[md.GetUid()]
		if p == nil {
			p = &pod{namespace: md.GetNamespace(), name: md.GetName(), uid: md.GetUid()}
			pods[md.GetUid()] = p
		}
		p.worst = max(p.worst, st)
		p.warn = p.warn || warn
		p.lines = append(p.lines, fmt.Sprintf("container %q: %s", name, line))
	}
	for i, st := range metrics.SliceStates {
		c.o.Metrics.Slices.With(st).Set(counts[i])
	}
	for id := range c.unproven {
		if !running[id] {
			delete(c.unproven, id)
		}
	}
	for uid := range c.written {
		if pods[uid] == nil {
			delete(c.written, uid)
		}
	}
	uids := make([]string, 0, len(pods))
	for uid := range pods {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	for _, uid := range uids {
		c.record(ctx, pods[uid])
	}
	return nil
}

// container checks one container's slices, module by module, and says
// what it found.
func (c *Checker) container(ctx context.Context, podUID string, alloc types.ContainerAllocation) (state, string) {
	modules, parts, err := c.o.Rewriter.ByModule(alloc)
	if err != nil {
		return unproven, err.Error()
	}
	var applied []string
	for i, m := range modules {
		part := parts[i]
		if !part.Shared() {
			continue
		}
		for _, s := range part.Devices {
			if !s.Exclusive && m.Devices[s.ID].SliceEnforcer == "" {
				return unenforced, fmt.Sprintf("no enforcer on this node holds device %s to its slice", s.ID)
			}
		}
		prover, ok := m.Plugin.(types.EnforcementProver)
		if !ok {
			return unenforced, fmt.Sprintf("device module %s cannot read back what it enforces", m.Name)
		}
		askCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		e, err := prover.Enforced(askCtx, podUID, part)
		cancel()
		if err != nil {
			return unproven, fmt.Sprintf("device module %s: %v", m.Name, err)
		}
		if err := e.Mismatch(part); err != nil {
			return mismatch, err.Error()
		}
		applied = append(applied, e.String())
	}
	return enforced, strings.Join(applied, "; ")
}

// record writes the pod's condition when it changed, and a Warning event
// when it is not True.
func (c *Checker) record(ctx context.Context, p *pod) {
	if c.o.Pods == nil {
		return
	}
	cond := condition{status: "True", reason: p.worst.reason(), message: strings.Join(p.lines, "; ")}
	if p.worst != enforced {
		cond.status = "False"
	}
	if len(cond.message) > maxMessageBytes {
		cond.message = cond.message[:maxMessageBytes-3] + "..."
	}
	if c.written[p.uid] == cond {
		return
	}
	logger := klog.FromContext(ctx).WithValues("pod", p.namespace+"/"+p.name)
	now := c.o.Now().UTC().Format(time.RFC3339)
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": p.uid}, // a precondition: this incarnation of the pod
		"status": map[string]any{"conditions": []map[string]any{{
			"type": kubeinterface.ConditionEnforced, "status": cond.status, "reason": cond.reason,
			"message": cond.message, "lastTransitionTime": now,
		}}},
	})
	writeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.o.Pods.PatchPodStatus(writeCtx, p.namespace, p.name, patch); err != nil {
		logger.Error(err, "Cannot record the pod's GPU slice enforcement", "condition", kubeinterface.ConditionEnforced)
		return
	}
	c.written[p.uid] = cond
	logger.V(2).Info("Recorded GPU slice enforcement", "status", cond.status, "reason", cond.reason, "message", cond.message)
	if !p.warn {
		return
	}
	event, _ := json.Marshal(map[string]any{
		"metadata":       map[string]any{"generateName": p.name + ".", "namespace": p.namespace},
		"involvedObject": map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": p.namespace, "name": p.name, "uid": p.uid},
		"reason":         "GPUSlice" + cond.reason, "message": cond.message, "type": "Warning",
		"source":         map[string]any{"component": "kubegpu-crishim", "host": c.o.Node},
		"firstTimestamp": now, "lastTimestamp": now, "count": 1,
		"reportingComponent": "kubegpu-crishim", "reportingInstance": c.o.Node,
	})
	if err := c.o.Pods.CreateEvent(writeCtx, p.namespace, event); err != nil {
		logger.Error(err, "Cannot post the event of the pod's GPU slice enforcement")
	}
}
