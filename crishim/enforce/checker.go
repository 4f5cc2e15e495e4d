package enforce

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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

// checkWorkers is how many containers a round proves at once.
const checkWorkers = 4

// DefaultProveTimeout is how long proving one container may take.
const DefaultProveTimeout = 15 * time.Second

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
	// Claims gives the policy of the kubegpu ResourceClaims whose devices
	// containers hold; nil: such containers are not proven.
	Claims  ClaimPolicies
	Runtime Runtime
	// Pods records the result; nil to record nothing (the shim without
	// an API client).
	Pods    Pods
	Metrics *metrics.Shim
	// Interval is the time between checks.
	Interval time.Duration
	// ProveTimeout bounds the read-back of one container
	// (DefaultProveTimeout if zero).
	ProveTimeout time.Duration
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
	// unverified are the containers whose allocation did not verify at
	// the last round (said once each).
	unverified map[string]bool

	mu sync.Mutex
	// inflight are the containers whose read-back is running.
	inflight map[string]bool
}

// New returns a checker.
func New(o Options) *Checker {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProveTimeout == 0 {
		o.ProveTimeout = DefaultProveTimeout
	}
	return &Checker{o: o, written: map[string]condition{}, unproven: map[string]int{}, unverified: map[string]bool{}, inflight: map[string]bool{}}
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

// work is one running container with slices to prove.
type work struct {
	id, name string
	sandbox  *runtimeapi.PodSandboxMetadata
	alloc    types.ContainerAllocation
	required bool
}

// proof is what proving one container found. fault marks what the shim
// itself could not do (a module that did not load, or reads nothing back):
// recorded, never a reason to stop the container.
type proof struct {
	st    state
	line  string
	fault bool
}

// Check runs one round: every running container with slices, proven
// checkWorkers at a time, each within Options.ProveTimeout.
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
	var jobs []work
	unverified := map[string]bool{}
	for _, ctr := range containers {
		sb := bySandbox[ctr.GetPodSandboxId()]
		if sb == nil {
			continue
		}
		md := sb.GetMetadata()
		alloc, required, err := c.allocation(ctr, sb)
		if err != nil {
			// CreateContainer refused it its devices, or the node no
			// longer verifies its allocation (a key removed) or its
			// claims': it is not proven, and said once.
			unverified[ctr.GetId()] = true
			if !c.unverified[ctr.GetId()] {
				logger.Info("Not proving the GPU slices of a container whose allocation does not verify here", "pod", md.GetNamespace()+"/"+md.GetName(),
					"container", ctr.GetMetadata().GetName(), "err", err)
			}
			continue
		}
		if !alloc.Shared() {
			continue
		}
		jobs = append(jobs, work{id: ctr.GetId(), name: alloc.Name, sandbox: md, alloc: alloc, required: required})
	}
	c.unverified = unverified

	proofs := make([]proof, len(jobs))
	sem := make(chan struct{}, checkWorkers)
	var wg sync.WaitGroup
	for i, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			proofs[i] = c.prove(ctx, j)
		})
	}
	wg.Wait()

	pods := map[string]*pod{}
	counts := make([]int64, len(metrics.SliceStates))
	running := map[string]bool{}
	for i, j := range jobs {
		pr := proofs[i]
		st, line := pr.st, pr.line
		running[j.id] = true
		warn := st == mismatch || st == unproven
		switch {
		case st == mismatch:
			c.o.Metrics.EnforcementMismatches.Inc()
		case st == unproven && !pr.fault:
			c.unproven[j.id]++
		}
		if st != unproven || pr.fault {
			delete(c.unproven, j.id)
		}
		if j.required && !pr.fault && (st == mismatch || st == unenforced || (st == unproven && c.unproven[j.id] >= UnprovenRounds)) {
			pod := j.sandbox.GetNamespace() + "/" + j.sandbox.GetName()
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := c.o.Runtime.StopContainer(stopCtx, j.id)
			cancel()
			if err != nil {
				logger.Error(err, "Cannot stop a container whose GPU slice is not enforced as granted", "pod", pod, "container", j.name)
			} else {
				c.o.Metrics.EnforcementStops.Inc()
				logger.Info("Stopped a container whose GPU slice is not enforced as granted (enforcement Required)", "pod", pod, "container", j.name, "state", st.String(), "detail", line)
				line += " (stopped: enforcement Required)"
				warn = true
			}
		}
		counts[st.metricIndex()]++
		uid := j.sandbox.GetUid()
		p := pods[uid]
		if p == nil {
			p = &pod{namespace: j.sandbox.GetNamespace(), name: j.sandbox.GetName(), uid: uid}
			pods[uid] = p
		}
		p.worst = max(p.worst, st)
		p.warn = p.warn || warn
		p.lines = append(p.lines, fmt.Sprintf("container %q: %s", j.name, line))
	}
	for i, st := range metrics.SliceStates {
		c.o.Metrics.Slices.With(st).Set(counts[i])
	}
	for id := range c.unproven {
		if !running[id] {
			delete(c.unproven, id)
		}
	}
	// A pod's record is forgotten once its sandbox is: a container
	// between restarts keeps it, and its events are not posted again.
	live := map[string]bool{}
	for _, sb := range sandboxes {
		live[sb.GetMetadata().GetUid()] = true
	}
	for uid := range c.written {
		if !live[uid] {
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

// prove checks one container within Options.ProveTimeout, whatever the module
// does with its context: a read-back still running from an earlier round
// (a module that ignores its deadline) is not started again, and the
// container's slices are unproven meanwhile.
func (c *Checker) prove(ctx context.Context, j work) proof {
	c.mu.Lock()
	if c.inflight[j.id] {
		c.mu.Unlock()
		return proof{st: unproven, line: "the enforcer's last read-back has not returned"}
	}
	c.inflight[j.id] = true
	c.mu.Unlock()
	done := make(chan proof, 1)
	proveCtx, cancel := context.WithTimeout(ctx, c.o.ProveTimeout)
	go func() {
		defer cancel()
		pr := c.container(proveCtx, j.sandbox.GetUid(), j.alloc)
		c.mu.Lock()
		delete(c.inflight, j.id)
		c.mu.Unlock()
		done <- pr
	}()
	timer := time.NewTimer(c.o.ProveTimeout + time.Second)
	defer timer.Stop()
	select {
	case pr := <-done:
		return pr
	case <-timer.C:
		return proof{st: unproven, line: fmt.Sprintf("the enforcer did not answer within %s", c.o.ProveTimeout)}
	}
}

// container checks one container's slices, module by module, and says
// what it found.
func (c *Checker) container(ctx context.Context, podUID string, alloc types.ContainerAllocation) proof {
	modules, parts, err := c.o.Rewriter.ByModule(alloc)
	if err != nil {
		return proof{st: unproven, line: err.Error(), fault: true}
	}
	var applied []string
	for i, m := range modules {
		part := parts[i]
		if !part.Shared() {
			continue
		}
		for _, s := range part.Devices {
			if !s.Exclusive && m.Devices[s.ID].SliceEnforcer == "" {
				return proof{st: unenforced, line: fmt.Sprintf("no enforcer on this node holds device %s to its slice", s.ID)}
			}
		}
		prover, ok := m.Plugin.(types.EnforcementProver)
		if !ok {
			return proof{st: unproven, line: fmt.Sprintf("device module %s publishes an enforcer but cannot read back what it enforces", m.Name), fault: true}
		}
		e, err := prover.Enforced(ctx, podUID, part)
		if err != nil {
			return proof{st: unproven, line: fmt.Sprintf("device module %s: %v", m.Name, err)}
		}
		if err := e.Mismatch(part); err != nil {
			return proof{st: mismatch, line: err.Error()}
		}
		applied = append(applied, e.String())
	}
	return proof{st: enforced, line: strings.Join(applied, "; ")}
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
		cut := maxMessageBytes - 3
		for cut > 0 && !utf8.RuneStart(cond.message[cut]) {
			cut--
		}
		cond.message = cond.message[:cut] + "..."
	}
	last, known := c.written[p.uid]
	if known && last == cond {
		return
	}
	logger := klog.FromContext(ctx).WithValues("pod", p.namespace+"/"+p.name)
	now := c.o.Now().UTC().Format(time.RFC3339)
	entry := map[string]any{"type": kubeinterface.ConditionEnforced, "status": cond.status, "reason": cond.reason, "message": cond.message}
	if !known || last.status != cond.status {
		// Merged by type: a patch without it keeps the time the status
		// last changed.
		entry["lastTransitionTime"] = now
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": p.uid}, // a precondition: this incarnation of the pod
		"status":   map[string]any{"conditions": []map[string]any{entry}},
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
