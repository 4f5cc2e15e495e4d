package kubeinterface

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The cluster's GPU capacity in aggregate, which kubegpu-scheduler
// publishes in a ConfigMap that every authenticated user may read
// (kube-scheduler/deploy/capacity.yaml): what a tenant, who may not
// read nodes, sees of the GPUs outside its namespace.
const (
	// CapacityConfigMap is the ConfigMap's default name, in the
	// scheduler's namespace (kube-system where the shipped manifests put
	// it).
	CapacityConfigMap = "kubegpu-capacity"
	// CapacityKey is the data key that holds the Capacity as JSON.
	CapacityKey = "capacity.json"
	// MaxCapacityModels bounds the models a Capacity lists; the GPUs of
	// later ones are counted under CapacityOtherModel.
	MaxCapacityModels = 64
	// CapacityOtherModel is the model the GPUs of models past the first
	// MaxCapacityModels are counted under.
	CapacityOtherModel = "other"
	// MaxCapacityBytes bounds the encoded Capacity.
	MaxCapacityBytes = 64 << 10
)

// Capacity counts the GPUs of live nodes by model. A GPU is a device that
// may be allocated: a GPU, or a MIG instance of a GPU in MIG mode (never
// the GPU itself).
type Capacity struct {
	// Updated is when the scheduler last wrote it (it rewrites an
	// unchanged capacity every CapacityRefresh, so that a reader can tell
	// a scheduler that stopped writing).
	Updated time.Time `json:"updated,omitzero"`
	// Nodes counts the live nodes with GPUs.
	Nodes  int             `json:"nodes"`
	Models []ModelCapacity `json:"models"`
}

// CapacityRefresh is how often an unchanged capacity is written again;
// a capacity older than twice that is stale.
const CapacityRefresh = 5 * time.Minute

// maxCapacityName bounds a model's or resource's name in a Capacity (a
// node publishes names of up to types.MaxDeviceStringBytes).
const maxCapacityName = 96

// ModelCapacity counts the GPUs of one model and device resource.
type ModelCapacity struct {
	Model    string `json:"model"`
	Resource string `json:"resource,omitempty"`
	// GPUs counts all; Unhealthy those not healthy; of the healthy ones,
	// Idle have no pod, Full have a whole-GPU pod or no memory or compute
	// left, and Stranded are partly used by slices: what is left of them
	// (StrandedMiB, in all) serves slices only, never a whole-GPU pod.
	GPUs        int   `json:"gpus"`
	Idle        int   `json:"idle"`
	Full        int   `json:"full"`
	Stranded    int   `json:"stranded"`
	Unhealthy   int   `json:"unhealthy"`
	StrandedMiB int64 `json:"strandedMiB"`
}

// GPUUse is what pods use of one GPU, the input of Capacity.Add.
type GPUUse struct {
	Healthy bool
	// Used: some pod holds it, whole or in part; Exclusive: a pod holds
	// it whole.
	Used, Exclusive bool
	// FreeMiB and FreeMilli are its memory and compute (thousandths)
	// left.
	FreeMiB, FreeMilli int64
}

// Add counts one GPU of model and resource (names cut to 96 bytes).
// Bound folds the models past MaxCapacityModels.
func (c *Capacity) Add(model, resource string, g GPUUse) {
	model, resource = cut(model), cut(resource)
	i := slices.IndexFunc(c.Models, func(m ModelCapacity) bool { return m.Model == model && m.Resource == resource })
	if i < 0 {
		c.Models = append(c.Models, ModelCapacity{Model: model, Resource: resource})
		i = len(c.Models) - 1
	}
	m := &c.Models[i]
	m.GPUs++
	switch {
	case !g.Healthy:
		m.Unhealthy++
	case !g.Used:
		m.Idle++
	case g.Exclusive || g.FreeMiB <= 0 || g.FreeMilli <= 0:
		m.Full++
	default:
		m.Stranded++
		m.StrandedMiB += g.FreeMiB
	}
}

// cut bounds a name to maxCapacityName bytes, on a rune boundary.
func cut(s string) string {
	if len(s) <= maxCapacityName {
		return s
	}
	i := maxCapacityName
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// Bound keeps the MaxCapacityModels-1 models with the most GPUs (by name
// among equals) and counts the others as CapacityOtherModel, then sorts
// the models by name and resource: the same counts give the same result
// whatever order the GPUs were added in.
func (c *Capacity) Bound() {
	if len(c.Models) > MaxCapacityModels {
		slices.SortFunc(c.Models, func(a, b ModelCapacity) int {
			if a.GPUs != b.GPUs {
				return b.GPUs - a.GPUs
			}
			return compareModels(a, b)
		})
		other := ModelCapacity{Model: CapacityOtherModel}
		for _, m := range c.Models[MaxCapacityModels-1:] {
			other.add(m)
		}
		c.Models = append(c.Models[:MaxCapacityModels-1], other)
	}
	c.Sort()
}

func compareModels(a, b ModelCapacity) int {
	if a.Model != b.Model {
		return strings.Compare(a.Model, b.Model)
	}
	return strings.Compare(a.Resource, b.Resource)
}

// Sort orders the models by name and resource.
func (c *Capacity) Sort() { slices.SortFunc(c.Models, compareModels) }

// Total sums the models.
func (c Capacity) Total() ModelCapacity {
	var t ModelCapacity
	for _, m := range c.Models {
		t.add(m)
	}
	return t
}

// add adds o's counts to m's.
func (m *ModelCapacity) add(o ModelCapacity) {
	m.GPUs += o.GPUs
	m.Idle += o.Idle
	m.Full += o.Full
	m.Stranded += o.Stranded
	m.Unhealthy += o.Unhealthy
	m.StrandedMiB += o.StrandedMiB
}

// ErrInvalidCapacity is wrapped by DecodeCapacity's errors; it wraps
// ErrInvalid.
var ErrInvalidCapacity = fmt.Errorf("%w: GPU capacity", ErrInvalid)

// EncodeCapacity is c, bounded (Bound), as the ConfigMap holds it.
func EncodeCapacity(c Capacity) (string, error) {
	c.Models = slices.Clone(c.Models)
	c.Bound()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // a model of 96 '<' stays 96 bytes
	if err := enc.Encode(c); err != nil {
		return "", err
	}
	if b.Len() > MaxCapacityBytes {
		return "", fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidCapacity, b.Len(), MaxCapacityBytes)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// DecodeCapacity reads what the ConfigMap holds, which its writer (or
// anyone who may write it) chose: bounded in size and in models,
// non-negative counts that add up, printable names.
func DecodeCapacity(s string) (Capacity, error) {
	var c Capacity
	if len(s) > MaxCapacityBytes {
		return c, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidCapacity, len(s), MaxCapacityBytes)
	}
	d := json.NewDecoder(strings.NewReader(s))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return Capacity{}, fmt.Errorf("%w: %w", ErrInvalidCapacity, err)
	}
	if d.More() {
		return Capacity{}, fmt.Errorf("%w: data after the object", ErrInvalidCapacity)
	}
	if len(c.Models) > MaxCapacityModels {
		return Capacity{}, fmt.Errorf("%w: %d models, at most %d", ErrInvalidCapacity, len(c.Models), MaxCapacityModels)
	}
	if !counts(c.Nodes) {
		return Capacity{}, fmt.Errorf("%w: %d nodes", ErrInvalidCapacity, c.Nodes)
	}
	for _, m := range c.Models {
		for _, s := range []string{m.Model, m.Resource} {
			if len(s) > maxCapacityName || !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
				return Capacity{}, fmt.Errorf("%w: model or resource %q", ErrInvalidCapacity, s)
			}
		}
		if !counts(m.GPUs, m.Idle, m.Full, m.Stranded, m.Unhealthy) || m.StrandedMiB < 0 || m.StrandedMiB > maxCount<<20 ||
			m.Idle+m.Full+m.Stranded+m.Unhealthy != m.GPUs {
			return Capacity{}, fmt.Errorf("%w: the counts of model %q do not add up", ErrInvalidCapacity, m.Model)
		}
	}
	return c, nil
}

// maxCount bounds each count a Capacity holds (sums of them cannot
// overflow).
const maxCount = 1 << 30

func counts(ns ...int) bool {
	for _, n := range ns {
		if n < 0 || n > maxCount {
			return false
		}
	}
	return true
}
