package devicescheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

// TestEnforcementRequired: under Required a slice goes only to a device
// with a slice enforcer, the refusal says so, and whole devices need none;
// under BestEffort any device with room serves.
func TestEnforcementRequired(t *testing.T) {
	e := newEngine(t, PolicyBinpack)
	n := simNode(t, e, "t4x4") // simNode's inventory has no enforcer
	required := func(cs ...types.ContainerRequest) *Request {
		r := request(t, e, cs...)
		if err := r.SetEnforcement(types.EnforcementRequired); err != nil {
			t.Fatal(err)
		}
		return r
	}
	var p Placement
	err := e.Evaluate(n, required(slice(25, 4096)), &p)
	var nf *NotFitError
	if !errors.As(err, &nf) || nf.Reason != ReasonUnenforced {
		t.Fatalf("Required slice on a node without an enforcer: %v, want reason %q", err, ReasonUnenforced)
	}
	if !strings.Contains(err.Error(), "0 of 4 healthy devices can enforce") {
		t.Errorf("refusal %q does not count the devices that can enforce", err)
	}
	if err := e.Evaluate(n, required(whole(2)), &p); err != nil {
		t.Errorf("Required whole GPUs need no enforcer: %v", err)
	}
	best := request(t, e, slice(25, 4096))
	if err := best.SetEnforcement(types.EnforcementBestEffort); err != nil {
		t.Fatal(err)
	}
	if err := e.Evaluate(n, best, &p); err != nil {
		t.Fatalf("BestEffort slice: %v", err)
	}
	if got := p.Allocation().Enforcement; got != types.EnforcementBestEffort {
		t.Errorf("allocation's enforcement %q, want %q", got, types.EnforcementBestEffort)
	}

	// One device of four enforces: a Required slice lands there, and a
	// second container's slice of the same pod on another device cannot.
	inv := n.Inventory()
	inv.Devices = append([]types.Device(nil), inv.Devices...)
	inv.Devices[2].SliceEnforcer = types.EnforcerMPS
	m, err := e.NewNode("one-enforcer", inv, Host{})
	if err != nil {
		t.Fatal(err)
	}
	r := required(slice(25, 4096))
	if err := e.Evaluate(m, r, &p); err != nil {
		t.Fatalf("Required slice with one enforcing device: %v", err)
	}
	if got := p.Devices(0, nil); len(got) != 1 || got[0] != 2 {
		t.Errorf("Required slice got devices %v, want [2], the one that enforces", got)
	}
	if got := p.Allocation().Enforcement; got != types.EnforcementRequired {
		t.Errorf("allocation's enforcement %q, want %q", got, types.EnforcementRequired)
	}
	two := types.ContainerRequest{Name: "c", Count: 2, ComputePercent: 25, MemoryMiB: 1024}
	if err := e.Evaluate(m, required(two), &p); !errors.As(err, &nf) || nf.Reason != ReasonUnenforced {
		t.Errorf("two Required slices with one enforcing device: %v, want reason %q", err, ReasonUnenforced)
	}

	// An enforcer holds a slice to what it names: under Required a slice
	// names both, and a refused request is left as it was.
	for _, half := range []types.ContainerRequest{slice(25, 0), slice(0, 4096)} {
		r := request(t, e, half)
		if err := r.SetEnforcement(types.EnforcementRequired); err == nil || !strings.Contains(err.Error(), "must set both") {
			t.Errorf("Required slice %+v: %v, want it refused for naming one of memory and compute", half, err)
		}
		if r.Enforcement != "" || r.Containers[0].Enforced {
			t.Errorf("a refused policy changed the request: %+v", r)
		}
		if err := r.SetEnforcement(types.EnforcementBestEffort); err != nil {
			t.Errorf("BestEffort slice %+v: %v", half, err)
		}
	}
}
