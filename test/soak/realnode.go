package main

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/internal/localnode"
	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// The labels containerd's CRI gives every container.
const (
	labelPodUID    = "io.kubernetes.pod.uid"
	labelContainer = "io.kubernetes.container.name"
	envVisible     = "NVIDIA_VISIBLE_DEVICES"
)

// realContainer is a running container of the real node, as containerd
// (not the shim) reports it.
type realContainer struct {
	id, podUID, name string
	visible          []string // NVIDIA_VISIBLE_DEVICES of its runtime spec
	held             string   // the ledger's kubegpu.io/held annotation
}

// realContainers lists the real node's running containers straight from
// containerd's CRI.
func (c *checker) realContainers(ctx context.Context) ([]realContainer, error) {
	conn, err := grpc.NewClient("unix://"+c.s.real.Containerd().Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return nil, err
	}
	var out []realContainer
	for _, ct := range list.Containers {
		st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.Id, Verbose: true})
		if err != nil {
			continue // gone meanwhile
		}
		rc := realContainer{id: ct.Id, podUID: ct.Labels[labelPodUID], name: ct.Labels[labelContainer],
			held: ct.Annotations[kubeinterface.AnnotationContainerHeld]}
		var info struct {
			RuntimeSpec struct {
				Process struct {
					Env []string `json:"env"`
				} `json:"process"`
			} `json:"runtimeSpec"`
		}
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err == nil {
			for _, e := range info.RuntimeSpec.Process.Env {
				if v, ok := strings.CutPrefix(e, envVisible+"="); ok && v != "void" && v != "" {
					rc.visible = strings.Split(v, ",")
				}
			}
		}
		out = append(out, rc)
	}
	return out, nil
}

// checkRealNode checks that every running container of the real node has
// exactly its pod's devices, and that nothing outlives its pod: no
// container, no limits directory or mount of the enforcer stand-in.
func (c *checker) checkRealNode(ctx context.Context, now time.Time) {
	pods := map[string]*corev1.Pod{}
	for _, p := range c.podsNow() {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			pods[string(p.UID)] = p
		}
	}
	containers, err := c.realContainers(ctx)
	c.mu.Lock()
	c.realRounds++
	if err != nil {
		c.realFailures++
	}
	c.mu.Unlock()
	if err == nil {
		c.checkNodeShares(containers)
		verify := c.verifyKeys()
		for _, rc := range containers {
			p := pods[rc.podUID]
			if p == nil {
				if c.goneFor(rc.podUID, now) > leakAfter {
					c.violate("leaked-container", rc.id, "running %s after its pod %s ended (the ledger still counts its devices)", leakAfter, rc.podUID)
				}
				continue
			}
			c.mu.Lock()
			delete(c.gone, rc.podUID)
			c.mu.Unlock()
			var want []string
			if h, err := objects.HeldAllocation(p, verify); err == nil {
				if ca, ok := h.Container(rc.name); ok {
					for _, d := range ca.Devices {
						want = append(want, d.UUID)
					}
				}
			}
			got := slices.Clone(rc.visible)
			slices.Sort(got)
			slices.Sort(want)
			// Twice in a row: a pod read before the watch caught up with
			// it is not a finding.
			key := podKey(p) + "/" + rc.name
			c.mu.Lock()
			suspect := c.suspects[key]
			c.suspects[key] = !slices.Equal(got, want)
			c.mu.Unlock()
			if !slices.Equal(got, want) && suspect {
				c.violate("wrong-devices", key, "container sees %v, its allocation gives %v", got, want)
			}
		}
	}
	c.checkLeftovers(pods, now, false)
}

// checkNodeShares checks, from the containers themselves, that no GPU is
// held beyond its capacity by the running containers of different pods:
// whole by one and used by another, or in slices over its compute. A
// container's share is what the ledger recorded on it (kubegpu.io/held);
// one without a record holds the GPUs it sees whole.
func (c *checker) checkNodeShares(containers []realContainer) {
	type holder struct {
		pod       string
		exclusive bool
		compute   int
	}
	byGPU := map[string][]holder{}
	for _, rc := range containers {
		shares := map[string]kubeinterface.HeldDevice{}
		if held, err := kubeinterface.DecodeHeld(rc.held); err == nil {
			for _, h := range held {
				shares[h.UUID] = h
			}
		}
		for _, uuid := range rc.visible {
			h := holder{pod: rc.podUID, exclusive: true, compute: 100}
			if s, ok := shares[uuid]; ok && !s.Exclusive {
				h = holder{pod: rc.podUID, compute: s.ComputePercent}
			}
			byGPU[uuid] = append(byGPU[uuid], h)
		}
	}
	for uuid, hs := range byGPU {
		pods, exclusive, compute := map[string]bool{}, false, 0
		for _, h := range hs {
			pods[h.pod] = true
			exclusive = exclusive || h.exclusive
			compute += h.compute
		}
		if len(pods) > 1 && (exclusive || compute > 100) {
			names := slices.Sorted(maps.Keys(pods))
			c.violate("node-double-allocation", uuid+"/"+strings.Join(names, ","),
				"GPU %s is used by running containers of pods %s (exclusive: %v, %d%% compute)", uuid, strings.Join(names, ", "), exclusive, compute)
		}
	}
}

// watchNode checks the node's containers for GPUs used twice every period
// for d.
func (c *checker) watchNode(ctx context.Context, d, period time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if containers, err := c.realContainers(ctx); err == nil {
			c.checkNodeShares(containers)
		}
		sleep(ctx, period)
	}
}

// goneFor is how long a pod UID has been missing, counted from the first
// call that found it missing.
func (c *checker) goneFor(uid string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.gone[uid]
	if !ok {
		c.gone[uid] = now
		return 0
	}
	return now.Sub(at)
}

// checkLeftovers finds the enforcer stand-in's limits directories and
// mounts (an MPS daemon's state on a real GPU node) and the claim specs
// of pods that ended; final counts any at all.
func (c *checker) checkLeftovers(pods map[string]*corev1.Pod, now time.Time, final bool) {
	root := filepath.Join(c.s.dir, "enforcer")
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		uid := e.Name()
		if pods[uid] == nil && (final || c.goneFor(uid, now) > leakAfter) {
			c.violate("leaked-limits", uid, "the enforcer's limits directory outlived its pod")
		}
	}
	mounts, _ := localnode.MountsUnder(root)
	for _, m := range mounts {
		rel, _ := filepath.Rel(root, m)
		uid, _, _ := strings.Cut(rel, string(filepath.Separator))
		if pods[uid] == nil && (final || c.goneFor(uid, now) > leakAfter) {
			c.violate("leaked-mount", m, "a limits mount outlived its pod")
		}
	}
	if final {
		specs, _ := os.ReadDir(c.s.real.ClaimsDir())
		for _, e := range specs {
			c.violate("leaked-claim-spec", e.Name(), "a claim's CDI spec is left after every pod ended")
		}
	}
}

// finalChecks waits, after the drain, until the real node has no running
// container and nothing left of the pods' devices, and counts what is
// left after leakAfter.
func (c *checker) finalChecks(ctx context.Context) {
	deadline := time.Now().Add(leakAfter)
	for time.Now().Before(deadline) {
		containers, err := c.realContainers(ctx)
		entries, _ := os.ReadDir(filepath.Join(c.s.dir, "enforcer"))
		if err == nil && len(containers) == 0 && len(entries) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
	containers, err := c.realContainers(ctx)
	if err != nil {
		c.violate("final", "", "cannot list the real node's containers: %v", err)
	}
	for _, rc := range containers {
		c.violate("leaked-container", rc.id, "still running %s after every pod ended (pod %s)", leakAfter, rc.podUID)
	}
	c.checkLeftovers(map[string]*corev1.Pod{}, time.Now(), true)
	c.checkAPI(time.Now())
}
