package plugin

import (
	"sync"

	fwk "k8s.io/kube-scheduler/framework"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// stateKey keys the plugin's data in the CycleState.
const stateKey fwk.StateKey = Name

// cycleState is one scheduling cycle's data for a GPU pod: the decoded
// request from PreFilter, each feasible node's score from Filter, and the
// devices Reserve chose for PreBind.
type cycleState struct {
	request *devicescheduler.Request

	mu     sync.Mutex
	scores map[string]int64

	// Set by Reserve.
	alloc types.PodAllocation
}

// Clone shares the state: it is written only by Filter (under mu) and
// Reserve, which run once per node and once per cycle.
func (s *cycleState) Clone() fwk.StateData { return s }

func (s *cycleState) setScore(node string, score int64) {
	s.mu.Lock()
	s.scores[node] = score
	s.mu.Unlock()
}

func (s *cycleState) score(node string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.scores[node]
	return v, ok
}

// getState returns the cycle's state, or nil for a pod without devices.
func getState(cs fwk.CycleState) *cycleState {
	d, err := cs.Read(stateKey)
	if err != nil {
		return nil
	}
	s, _ := d.(*cycleState)
	return s
}
