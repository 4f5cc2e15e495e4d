package claimplugin

import (
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

func signedAlloc(t *testing.T, key *kubeinterface.Key, uid ktypes.UID, node string, devices ...string) *resourceapi.AllocationResult {
	t.Helper()
	return signedRequest(t, key, uid, node, "gpus", devices...)
}

// signedRequest is a signed allocation of devices to the claim's request
// req ("<request>" or "<request>/<subrequest>").
func signedRequest(t *testing.T, key *kubeinterface.Key, uid ktypes.UID, node, req string, devices ...string) *resourceapi.AllocationResult {
	t.Helper()
	c := types.ContainerAllocation{Name: dra.ClaimEntry("gpu", req)}
	res := &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Devices = append(c.Devices, types.DeviceShare{ID: d, UUID: "GPU-" + d, Exclusive: true})
		res.Devices.Results = append(res.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: req, Driver: dra.DriverName, Pool: node, Device: d})
	}
	cfg, err := dra.SignedConfigFor(key.Sign, kubeinterface.PodRef{Namespace: "ns", Name: "c", UID: uid},
		types.PodAllocation{Node: node, Containers: []types.ContainerAllocation{c}})
	if err != nil {
		t.Fatal(err)
	}
	res.Devices.Config = []resourceapi.DeviceAllocationConfiguration{cfg}
	return res
}

func testKey(t *testing.T) *kubeinterface.Key {
	t.Helper()
	k, err := kubeinterface.NewHMACKey([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPrepareAndShares: a claim prepared on its node resolves into its
// signed devices with its UID, also read back by a new store (a restarted shim), and
// no longer once unprepared.
func TestPrepareAndShares(t *testing.T) {
	key := testKey(t)
	s := &Store{Dir: t.TempDir(), Node: "n1", Keys: kubeinterface.NewKeySet(key)}
	p := &Plugin{store: s}
	claim := &resourceapi.ResourceClaim{}
	claim.Namespace, claim.Name, claim.UID = "ns", "c", "u1"
	claim.Status.Allocation = signedAlloc(t, key, "u1", "n1", "gpu0", "gpu1")
	res, err := p.prepare(claim)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range res.Devices {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	restarted := &Store{Dir: s.Dir, Node: "n1", Keys: s.Keys}
	shares, used, err := restarted.Shares(append([]string{"k8s.example.com/nic=eth1"}, ids...))
	if err != nil || len(shares) != 2 || len(used) != 2 || shares[0].ID != "gpu0" || shares[1].ID != "gpu1" || shares[0].Claim != "u1" || shares[1].Claim != "u1" || shares[0].Request != "gpus" {
		t.Fatalf("Shares = %+v, %v, %v; want gpu0 and gpu1 of claim u1", shares, used, err)
	}
	if policy, err := restarted.Enforcement("u1"); err != nil || policy != "" {
		t.Errorf("Enforcement = %q, %v; want the signed allocation's, none", policy, err)
	}
	if err := s.remove("u1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enforcement("u1"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Enforcement after unprepare: %v, want ErrInvalid", err)
	}
	if _, _, err := s.Shares(ids); !errors.Is(err, ErrInvalid) {
		t.Errorf("after unprepare: %v, want ErrInvalid", err)
	}
	if _, _, err := s.Shares([]string{CDIKind + "=nounderscore"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a malformed name: %v, want ErrInvalid", err)
	}
}

// TestPrepareRefuses: allocations not signed for this claim on this node,
// or that give devices the scheduler did not sign, are not prepared.
func TestPrepareRefuses(t *testing.T) {
	key := testKey(t)
	other, err := kubeinterface.NewHMACKey([]byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{Dir: t.TempDir(), Node: "n1", Keys: kubeinterface.NewKeySet(key)}
	extra := signedAlloc(t, key, "u1", "n1", "gpu0")
	extra.Devices.Results = append(extra.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: dra.DriverName, Pool: "n1", Device: "gpu1"})
	swapped := signedAlloc(t, key, "u1", "n1", "gpu0")
	swapped.Devices.Results[0].Device = "gpu3"
	otherAlt := signedRequest(t, key, "u1", "n1", "gpus/four", "gpu0")
	otherAlt.Devices.Results[0].Request = "gpus/eight"
	for name, alloc := range map[string]*resourceapi.AllocationResult{
		"unsigned":            {Devices: resourceapi.DeviceAllocationResult{Results: extra.Devices.Results}},
		"another key":         signedAlloc(t, other, "u1", "n1", "gpu0"),
		"another claim":       signedAlloc(t, key, "u2", "n1", "gpu0"),
		"another node":        signedAlloc(t, key, "u1", "n2", "gpu0"),
		"a device more":       extra,
		"another device":      swapped,
		"another alternative": otherAlt,
	} {
		if _, err := s.verify("u1", "ns", "c", alloc); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// TestPrepareAlternative: the devices of a firstAvailable request's
// alternative ("<request>/<subrequest>") prepare and resolve under a CDI
// name without the "/" that CDI names may not hold.
func TestPrepareAlternative(t *testing.T) {
	key := testKey(t)
	s := &Store{Dir: t.TempDir(), Node: "n1", Keys: kubeinterface.NewKeySet(key)}
	p := &Plugin{store: s}
	claim := &resourceapi.ResourceClaim{}
	claim.Namespace, claim.Name, claim.UID = "ns", "c", "u1"
	claim.Status.Allocation = signedRequest(t, key, "u1", "n1", "gpus/four", "gpu2", "gpu3")
	res, err := p.prepare(claim)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range res.Devices {
		if len(d.Requests) != 1 || d.Requests[0] != "gpus/four" {
			t.Errorf("device %s for requests %v, want gpus/four", d.DeviceName, d.Requests)
		}
		ids = append(ids, d.CDIDeviceIDs...)
	}
	if len(ids) != 2 || ids[0] != CDIKind+"=u1_gpus.four_gpu2" {
		t.Errorf("CDI devices %v", ids)
	}
	shares, _, err := (&Store{Dir: s.Dir, Node: "n1", Keys: s.Keys}).Shares(ids)
	if err != nil || len(shares) != 2 || shares[0].ID != "gpu2" || shares[1].ID != "gpu3" || shares[0].Request != "gpus" {
		t.Fatalf("Shares = %+v, %v; want gpu2 and gpu3 of request gpus", shares, err)
	}
}
