package sim

import (
	"fmt"
	"testing"
	"time"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// placed is one pod a scheduler placed: what a restarted one finds running.
type placed struct {
	id    string
	node  int
	alloc types.PodAllocation
	r     *devicescheduler.Request
}

// placeLikeTheScheduler places p as kubegpu-scheduler does: the best node
// by the engine's score, then the pod is learned (at Reserve). It returns
// the node's index (-1: none) and the score.
func placeLikeTheScheduler(s *engineScheduler, id string, p *PodSpec) (int, int64, *placed) {
	r := s.request(p)
	best := -1
	for i, n := range s.nodes {
		if err := s.engine.Evaluate(n, r, &s.cur); err != nil {
			continue
		}
		if best < 0 || s.cur.Score() > s.best.Score() {
			s.best, best = s.cur, i
		}
	}
	if best < 0 {
		return -1, 0, nil
	}
	score, alloc := s.best.Score(), s.best.Allocation()
	if err := s.nodes[best].AssumePlacement(id, &s.best, r.Host); err != nil {
		panic(err)
	}
	s.engine.ObservePod(id, r, time.Time{})
	return best, score, &placed{id: id, node: best, alloc: alloc, r: r}
}

// TestRestartedSchedulerScoresAlike: a scheduler that restarts halfway
// through the openb replay and rebuilds its state and learned mix from the
// pods running (as kube-scheduler/mix does) places and scores the next
// 1,000 pods exactly as one that never restarted.
func TestRestartedSchedulerScoresAlike(t *testing.T) {
	if testing.Short() {
		t.Skip("replays part of the openb trace")
	}
	nodes, pods := readOpenb(t, "openb_pod_list_default.csv")
	x, err := NewExperiment(nodes, pods, 42, 1.3)
	if err != nil {
		t.Fatal(err)
	}
	newScheduler := func() *engineScheduler {
		s, err := newEngineScheduler(x, testDevices(t), devicescheduler.PolicyKubegpu, true)
		if err != nil {
			t.Fatal(err)
		}
		return s.(*engineScheduler)
	}
	never := newScheduler()
	split := len(x.Pods) / 2
	var running []*placed
	for i := range split {
		if _, _, pl := placeLikeTheScheduler(never, fmt.Sprint(i), &x.Pods[i]); pl != nil {
			running = append(running, pl)
		}
	}
	restarted := newScheduler()
	for _, pl := range running {
		if err := restarted.nodes[pl.node].Assume(pl.id, pl.alloc, pl.r.Host); err != nil {
			t.Fatal(err)
		}
		restarted.engine.ObservePod(pl.id, pl.r, time.Time{})
	}
	differ := 0
	next := min(1000, len(x.Pods)-split)
	for i := split; i < split+next; i++ {
		id := fmt.Sprint(i)
		n1, s1, _ := placeLikeTheScheduler(never, id, &x.Pods[i])
		n2, s2, _ := placeLikeTheScheduler(restarted, id, &x.Pods[i])
		if n1 != n2 || s1 != s2 {
			differ++
			if differ <= 5 {
				t.Errorf("pod %d: the scheduler that never restarted chose node %d (score %d), the restarted one node %d (score %d)", i, n1, s1, n2, s2)
			}
		}
	}
	t.Logf("%d pods running at the restart (%d learned types); of the next %d, %d placed or scored differently", len(running), len(restarted.engine.Workload().Types()), next, differ)
	if differ > 0 {
		t.Errorf("%d of %d pods placed or scored differently after the restart, want none", differ, next)
	}
}
