package claimplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/types"
)

// CDIKind is the CDI kind of the devices of kubegpu's claims. Its CDI
// device names are "<claim UID>_<request>_<device>".
const CDIKind = dra.ClaimCDIKind

// cdiVersion is the CDI specification version the spec files declare.
const cdiVersion = "0.6.0"

// annotationAllocation holds, in a spec file, the signed allocation it
// was written from.
const annotationAllocation = dra.DriverName + "/allocation"

// maxSpecBytes bounds a spec file read back: a claim's allocation is at
// most the API's 10 KiB of configuration plus the device entries.
const maxSpecBytes = 1 << 20

// Store keeps the prepared claims' CDI spec files in Dir.
type Store struct {
	Dir  string
	Node string
	Keys *kubeinterface.KeySet
}

// ErrInvalid is wrapped when a claim's allocation may not be prepared
// here, or a container names a kubegpu claim device this node has not
// prepared.
var ErrInvalid = errors.New("kubegpu claim")

type spec struct {
	CDIVersion  string            `json:"cdiVersion"`
	Kind        string            `json:"kind"`
	Annotations map[string]string `json:"annotations"`
	Devices     []specDevice      `json:"devices"`
}

type specDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		Env []string `json:"env"`
	} `json:"containerEdits"`
}

// prepared is a claim's verified allocation: its devices by CDI name.
type prepared struct {
	value  string
	shares map[string]types.DeviceShare
	// results are the claim's results of driver dra.DriverName, in order,
	// with their CDI names.
	results []resourceapi.DeviceRequestAllocationResult
	names   []string
}

// verify checks a claim's signed allocation against its standard
// allocation and pairs each of its results with a signed device.
func (s *Store) verify(uid ktypes.UID, namespace, name string, alloc *resourceapi.AllocationResult) (*prepared, error) {
	a, value, err := dra.SignedValue(alloc)
	if err != nil {
		return nil, fmt.Errorf("%w %s/%s: %w", ErrInvalid, namespace, name, err)
	}
	if err := s.Keys.Verify(a); err != nil {
		return nil, fmt.Errorf("%w %s/%s: %w", ErrInvalid, namespace, name, err)
	}
	if a.Pod.UID != uid || a.Pod.Namespace != namespace || a.Pod.Name != name {
		return nil, fmt.Errorf("%w %s/%s: the signed allocation is for %s/%s (uid %s)", ErrInvalid, namespace, name, a.Pod.Namespace, a.Pod.Name, a.Pod.UID)
	}
	if a.Node != s.Node {
		return nil, fmt.Errorf("%w %s/%s: the allocation is for node %q, this is node %q", ErrInvalid, namespace, name, a.Node, s.Node)
	}
	byRequest := map[string][]types.DeviceShare{}
	signed := 0
	for _, c := range a.Containers {
		req, ok := dra.ClaimEntryRequest(c.Name)
		if !ok {
			return nil, fmt.Errorf("%w %s/%s: signed entry %q is no claim request", ErrInvalid, namespace, name, c.Name)
		}
		byRequest[req] = append(byRequest[req], c.Devices...)
		signed += len(c.Devices)
	}
	p := &prepared{value: value, shares: map[string]types.DeviceShare{}}
	for _, r := range alloc.Devices.Results {
		if r.Driver != dra.DriverName {
			continue
		}
		if r.Pool != s.Node {
			return nil, fmt.Errorf("%w %s/%s: device %s is in pool %s, not this node's", ErrInvalid, namespace, name, r.Device, r.Pool)
		}
		list := byRequest[r.Request]
		i := -1
		for j, d := range list {
			if dra.DeviceName(d.ID) == r.Device {
				i = j
				break
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("%w %s/%s: request %s was given device %s, which the scheduler did not sign", ErrInvalid, namespace, name, r.Request, r.Device)
		}
		cdiName := cdiDeviceName(uid, r.Request, r.Device)
		p.shares[cdiName] = list[i]
		byRequest[r.Request] = append(list[:i], list[i+1:]...)
		p.results = append(p.results, r)
		p.names = append(p.names, cdiName)
	}
	if len(p.results) != signed {
		return nil, fmt.Errorf("%w %s/%s: the allocation gives %d devices, the scheduler signed %d", ErrInvalid, namespace, name, len(p.results), signed)
	}
	return p, nil
}

func (s *Store) path(uid ktypes.UID) string {
	return filepath.Join(s.Dir, strings.ReplaceAll(CDIKind, "/", "_")+"_"+string(uid)+".json")
}

// write writes a claim's spec file, atomically.
func (s *Store) write(uid ktypes.UID, p *prepared) error {
	sp := spec{CDIVersion: cdiVersion, Kind: CDIKind, Annotations: map[string]string{annotationAllocation: p.value}}
	for _, n := range p.names {
		d := specDevice{Name: n}
		d.ContainerEdits.Env = []string{"KUBEGPU_CLAIM_DEVICE=" + p.shares[n].UUID}
		sp.Devices = append(sp.Devices, d)
	}
	b, err := json.Marshal(sp)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.Dir, ".claim-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.path(uid))
}

// remove removes a claim's spec file; a missing one is no error.
func (s *Store) remove(uid ktypes.UID) error {
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Shares resolves the CDI devices of kubegpu's claims among cdi (a
// container's, as kubelet passes them) into the devices they stand for,
// read from the claims' spec files and verified again, each with its
// claim's UID. used are the CDI
// names it resolved, for the caller to remove from the container's
// config. A device of kind CDIKind this node has not prepared is an
// error wrapping ErrInvalid.
func (s *Store) Shares(cdi []string) (shares []kubeinterface.HeldDevice, used []string, err error) {
	specs := map[ktypes.UID]map[string]types.DeviceShare{}
	for _, id := range cdi {
		name, ok := strings.CutPrefix(id, CDIKind+"=")
		if !ok {
			continue
		}
		uid, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, nil, fmt.Errorf("%w device %s: not a kubegpu claim device name", ErrInvalid, id)
		}
		byName, ok := specs[ktypes.UID(uid)]
		if !ok {
			if byName, err = s.read(ktypes.UID(uid)); err != nil {
				return nil, nil, err
			}
			specs[ktypes.UID(uid)] = byName
		}
		share, ok := byName[name]
		if !ok {
			return nil, nil, fmt.Errorf("%w device %s: not prepared on this node", ErrInvalid, id)
		}
		// The request between the UID and the device ("request" or
		// "request.subrequest"): its top-level name.
		req := name[len(uid)+1 : strings.LastIndex(name, "_")]
		req, _, _ = strings.Cut(req, ".")
		shares = append(shares, kubeinterface.HeldDevice{DeviceShare: share, Claim: uid, Request: req})
		used = append(used, id)
	}
	return shares, used, nil
}

// Enforcement is the policy kubegpu-scheduler placed claim uid's slices
// under, read back from its spec file and verified again. An error wraps
// ErrInvalid.
func (s *Store) Enforcement(uid string) (types.EnforcementPolicy, error) {
	a, err := s.allocation(ktypes.UID(uid))
	if err != nil {
		return "", err
	}
	return a.Enforcement, nil
}

// read reads a claim's spec file back, verifies the allocation in it and
// returns its devices by CDI name.
func (s *Store) read(uid ktypes.UID) (map[string]types.DeviceShare, error) {
	a, err := s.allocation(uid)
	if err != nil {
		return nil, err
	}
	out := map[string]types.DeviceShare{}
	for _, c := range a.Containers {
		req, ok := dra.ClaimEntryRequest(c.Name)
		if !ok {
			return nil, fmt.Errorf("%w %s: spec file: signed entry %q is no claim request", ErrInvalid, uid, c.Name)
		}
		for _, d := range c.Devices {
			out[cdiDeviceName(uid, req, dra.DeviceName(d.ID))] = d
		}
	}
	return out, nil
}

// allocation reads a claim's spec file back and verifies the allocation
// in it.
func (s *Store) allocation(uid ktypes.UID) (kubeinterface.Allocation, error) {
	f, err := os.Open(s.path(uid))
	if err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: not prepared on this node: %w", ErrInvalid, uid, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: spec file: %w", ErrInvalid, uid, err)
	}
	if len(b) > maxSpecBytes {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: spec file over %d bytes", ErrInvalid, uid, maxSpecBytes)
	}
	var sp spec
	if err := json.Unmarshal(b, &sp); err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: spec file: %w", ErrInvalid, uid, err)
	}
	a, err := kubeinterface.DecodeAllocation(sp.Annotations[annotationAllocation])
	if err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: spec file: %w", ErrInvalid, uid, err)
	}
	if err := s.Keys.Verify(a); err != nil {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: spec file: %w", ErrInvalid, uid, err)
	}
	if a.Pod.UID != uid || a.Node != s.Node {
		return kubeinterface.Allocation{}, fmt.Errorf("%w %s: the spec file's allocation is for claim %s on node %s", ErrInvalid, uid, a.Pod.UID, a.Node)
	}
	return a, nil
}

// cdiDeviceName is the CDI name of device dev of claim uid's request req
// (a result's request: "<request>" or "<request>/<subrequest>"): UIDs,
// request and device names have no "_", and the "/" that CDI names may
// not hold becomes ".", which no request name holds either.
func cdiDeviceName(uid ktypes.UID, req, dev string) string {
	return string(uid) + "_" + strings.ReplaceAll(req, "/", ".") + "_" + dev
}
