package kubeinterface

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubegpu/kubegpu/types"
)

// MaxPayloadBytes bounds a kubegpu annotation. The API server allows 256 KiB
// for all of an object's annotations together.
const MaxPayloadBytes = 128 << 10

var (
	// ErrNoInventory means the node carries no inventory annotation: it is
	// not a kubegpu node, or its advertiser has not published yet.
	ErrNoInventory = errors.New("node has no " + AnnotationInventory + " annotation")
	// ErrNoAllocation means the pod carries no allocation annotation.
	ErrNoAllocation = errors.New("pod has no " + AnnotationAllocation + " annotation")
)

// header is the versioned envelope of every payload.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// inventoryPayload is the wire form of a node inventory.
type inventoryPayload struct {
	header
	types.Inventory
}

// EncodeInventory returns the annotation value for inv, which must be valid.
func EncodeInventory(inv types.Inventory) (string, error) {
	if err := inv.Validate(); err != nil {
		return "", fmt.Errorf("encode inventory: %w", err)
	}
	b, err := json.Marshal(inventoryPayload{header{types.SchemaVersion, KindInventory}, inv})
	if err != nil {
		return "", fmt.Errorf("encode inventory: %w", err)
	}
	if len(b) > MaxPayloadBytes {
		return "", fmt.Errorf("encode inventory: %d bytes is over the %d-byte limit for %s", len(b), MaxPayloadBytes, AnnotationInventory)
	}
	return string(b), nil
}

// DecodeInventory parses and validates an inventory annotation value.
// Malformed input gives an error wrapping ErrInvalid.
func DecodeInventory(value string) (types.Inventory, error) {
	var p inventoryPayload
	if err := decode(value, AnnotationInventory, KindInventory, &p.header, &p); err != nil {
		return types.Inventory{}, err
	}
	if err := p.Validate(); err != nil {
		return types.Inventory{}, fmt.Errorf("%w: %s: %w", ErrInvalid, AnnotationInventory, err)
	}
	return p.Inventory, nil
}

// PodRef binds an allocation to one incarnation of one pod.
type PodRef struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	UID       ktypes.UID `json:"uid"`
}

// Allocation is the wire form of a pod's allocation: which devices each
// container got, for which pod on which node, signed by the scheduler.
type Allocation struct {
	Pod PodRef `json:"pod"`
	types.PodAllocation
	// Critical names fields that a reader must understand to use the
	// allocation. A newer scheduler lists there the fields it adds that
	// change what a container may get (a reader that ignored them would give
	// more), and a reader that does not know one refuses the allocation.
	// This version knows CriticalEnforcement, which Sign lists when the
	// policy is Required and a container has a slice: a node that
	// predates it would start the slices unenforced.
	Critical []string `json:"critical,omitempty"`
	// Signature is the scheduler's signature over SigningBytes, base64.
	Signature string `json:"signature,omitempty"`
	// signed holds the exact bytes Signature covers when the allocation was
	// read from an annotation (see DecodeAllocation); nil for one built
	// here, whose bytes are its encoding. known is the encoding of the
	// fields this version knows as read: signed counts only while they are
	// unchanged.
	signed, known []byte
}

// CriticalEnforcement is the Critical entry of an allocation under
// EnforcementRequired.
const CriticalEnforcement = "enforcement"

// maxCritical bounds an allocation's Critical entries.
const maxCritical = 16

// knownCritical are the Critical entries this version understands.
var knownCritical = []string{CriticalEnforcement}

// withCritical returns a with Critical listing the fields its content
// needs a reader to understand.
func (a Allocation) withCritical() Allocation {
	a.Critical = nil
	if a.Enforcement == types.EnforcementRequired && a.hasSlice() {
		a.Critical = []string{CriticalEnforcement}
	}
	return a
}

// hasSlice reports whether a container has a share of a device rather
// than the whole of it: only slices need an enforcer.
func (a Allocation) hasSlice() bool {
	for _, list := range [][]types.ContainerAllocation{a.InitContainers, a.Containers} {
		for _, c := range list {
			if c.Shared() {
				return true
			}
		}
	}
	return false
}

type allocationPayload struct {
	header
	Allocation
}

// SigningBytes is what Signature signs: the payload without its signature.
// For an allocation read by DecodeAllocation these are the exact bytes its
// writer signed, fields this version does not know included, so that an
// allocation from a newer scheduler verifies on an older node. For one built
// here they are its encoding: encoding/json writes struct fields in a fixed
// order, and Signature last, so the annotation is these bytes with the
// signature appended as the last member.
func (a Allocation) SigningBytes() []byte {
	b := a.encoding()
	if a.signed != nil && bytes.Equal(b, a.known) {
		return a.signed
	}
	return b
}

// encoding is a's encoding without its signature.
func (a Allocation) encoding() []byte {
	a.Signature, a.signed, a.known = "", nil, nil
	b, err := json.Marshal(allocationPayload{header{types.SchemaVersion, KindAllocation}, a})
	if err != nil {
		// Only plain strings and numbers: Marshal cannot fail.
		panic(fmt.Sprintf("marshal allocation: %v", err))
	}
	return b
}

// Validate checks that the allocation names a pod and a node and that every
// share is well formed.
func (a Allocation) Validate() error {
	c := &collector{object: AnnotationAllocation}
	if a.Pod.Namespace == "" || a.Pod.Name == "" || a.Pod.UID == "" {
		c.add("", "pod", fmt.Sprintf("%s/%s uid=%s", a.Pod.Namespace, a.Pod.Name, a.Pod.UID), "a namespace, name and uid")
	}
	if a.Node == "" {
		c.add("", "node", "", "the name of the node")
	}
	if a.Enforcement != "" && !a.Enforcement.Valid() {
		c.add("", "enforcement", string(a.Enforcement), fmt.Sprintf("%s or %s", types.EnforcementRequired, types.EnforcementBestEffort))
	}
	names := map[string]bool{}
	for _, list := range [][]types.ContainerAllocation{a.InitContainers, a.Containers} {
		for _, ctr := range list {
			if ctr.Name == "" || names[ctr.Name] {
				c.add("", "containers[].name", ctr.Name, "a unique, non-empty container name")
			}
			names[ctr.Name] = true
			for _, d := range ctr.Devices {
				if d.ID == "" || d.UUID == "" {
					c.add(ctr.Name, "devices[].id and uuid", d.ID+" "+d.UUID, "non-empty")
				}
				if d.MemoryMiB < 0 {
					c.add(ctr.Name, "devices[].memoryMiB", fmt.Sprint(d.MemoryMiB), "zero or more")
				}
				if d.ComputePercent < 0 || d.ComputePercent > types.MaxComputePercent {
					c.add(ctr.Name, "devices[].computePercent", fmt.Sprint(d.ComputePercent), fmt.Sprintf("0..%d", types.MaxComputePercent))
				}
				if !d.Exclusive && d.ComputePercent == 0 && d.MemoryMiB == 0 {
					c.add(ctr.Name, "devices[] share of "+d.ID, "0% and 0 MiB", "exclusive, or a computePercent or memoryMiB above zero")
				}
			}
		}
	}
	return c.err()
}

// EncodeAllocation returns the annotation value for a, which must be valid.
// An allocation read by DecodeAllocation encodes to the value it was read
// from, so that it keeps verifying.
func EncodeAllocation(a Allocation) (string, error) {
	if err := a.Validate(); err != nil {
		return "", fmt.Errorf("encode allocation: %w", err)
	}
	if a.signed != nil && a.Signature != "" && bytes.Equal(a.encoding(), a.known) {
		return string(a.signed[:len(a.signed)-1]) + signatureMember(a.Signature), nil
	}
	b, err := json.Marshal(allocationPayload{header{types.SchemaVersion, KindAllocation}, a})
	if err != nil {
		return "", fmt.Errorf("encode allocation: %w", err)
	}
	return string(b), nil
}

// DecodeAllocation parses and validates an allocation annotation value. It
// does not check the signature, but keeps the exact bytes it covers: the
// value up to the signature, which must be its last member, as every
// kubegpu-scheduler writes it. Fields this version does not know are
// ignored (and stay covered by the signature). Malformed input gives an
// error wrapping ErrInvalid.
func DecodeAllocation(value string) (Allocation, error) {
	var p allocationPayload
	if err := decode(value, AnnotationAllocation, KindAllocation, &p.header, &p); err != nil {
		return Allocation{}, err
	}
	if err := p.Validate(); err != nil {
		return Allocation{}, err
	}
	if len(p.Critical) > maxCritical {
		return Allocation{}, &FieldError{Field: AnnotationAllocation + " critical", Value: fmt.Sprintf("%d entries", len(p.Critical)), Want: fmt.Sprintf("at most %d", maxCritical)}
	}
	for _, c := range p.Critical {
		if !slices.Contains(knownCritical, c) {
			return Allocation{}, &FieldError{Field: AnnotationAllocation + " critical", Value: strings.Join(p.Critical, ","),
				Want: "fields this version knows (" + strings.Join(knownCritical, ", ") + "): the allocation was written by a newer kubegpu-scheduler; upgrade this component"}
		}
	}
	if p.Signature != "" {
		member := signatureMember(p.Signature)
		if !strings.HasSuffix(value, member) || len(value) == len(member) {
			return Allocation{}, &FieldError{Field: AnnotationAllocation + " signature", Value: p.Signature,
				Want: "the object's last member, as kubegpu-scheduler writes it (the value was re-formatted or changed)"}
		}
		p.signed = []byte(value[:len(value)-len(member)] + "}")
		p.known = p.encoding()
	}
	return p.Allocation, nil
}

// signatureMember is how an encoded allocation ends: its signature as the
// last member of the object. Signatures hold only characters that JSON
// writes unescaped (see Key.Sign).
func signatureMember(signature string) string {
	return `,"signature":"` + signature + `"}`
}

// decode unmarshals a versioned payload into out after checking its size,
// apiVersion and kind; hdr must point into out.
func decode(value, key, kind string, hdr *header, out any) error {
	if len(value) > MaxPayloadBytes {
		return &FieldError{Field: key, Value: fmt.Sprintf("%d bytes", len(value)), Want: fmt.Sprintf("at most %d bytes", MaxPayloadBytes)}
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(value)))
	if err := dec.Decode(out); err != nil {
		return &FieldError{Field: key, Value: value, Want: "a JSON object (" + err.Error() + ")"}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &FieldError{Field: key, Value: value, Want: "a single JSON object"}
	}
	if hdr.APIVersion != types.SchemaVersion {
		want := "apiVersion " + types.SchemaVersion
		if hdr.APIVersion != "" {
			want += " (written by a different kubegpu version: upgrade the older component)"
		}
		return &FieldError{Field: key + " apiVersion", Value: hdr.APIVersion, Want: want}
	}
	if hdr.Kind != kind {
		return &FieldError{Field: key + " kind", Value: hdr.Kind, Want: kind}
	}
	return nil
}

// abbreviate keeps error messages short when the value is large.
func abbreviate(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
