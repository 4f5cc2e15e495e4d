package objects

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// Bounds of the values a container may ask for.
const (
	// MaxDevicesPerContainer bounds nvidia.com/gpu.
	MaxDevicesPerContainer = 64
	// MaxSliceMemoryMiB bounds kubegpu.io/gpu-memory (1 TiB).
	MaxSliceMemoryMiB = 1 << 20
)

// WantsDevices reports cheaply whether any container of the pod asks for
// GPUs, so that callers can skip non-GPU pods before decoding anything.
func WantsDevices(pod *corev1.Pod) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			for _, rl := range []corev1.ResourceList{list[i].Resources.Limits, list[i].Resources.Requests} {
				for _, name := range []corev1.ResourceName{kubeinterface.ResourceGPU, kubeinterface.ResourceGPUMemory, kubeinterface.ResourceGPUCores} {
					if q, ok := rl[name]; ok && !q.IsZero() {
						return true
					}
				}
			}
		}
	}
	return false
}

// PodRequest decodes what the pod asks for from its containers' limits and
// its kubegpu.io annotations. A pod that asks for no GPUs gets an empty
// request and no error, whatever its annotations say. Every problem found is
// reported at once in an *kubeinterface.InvalidError, which wraps kubeinterface.ErrInvalid.
//
// An unset topology policy is left empty for the scheduler to default.
func PodRequest(pod *corev1.Pod) (types.PodRequest, error) {
	if !WantsDevices(pod) {
		return types.PodRequest{}, nil
	}
	c := &collector{object: fmt.Sprintf("pod %s/%s", pod.Namespace, pod.Name)}

	sel := types.Selector{
		IncludeModels: parseList(c, pod.Annotations, kubeinterface.AnnotationModelInclude),
		ExcludeModels: parseList(c, pod.Annotations, kubeinterface.AnnotationModelExclude),
		IncludeUUIDs:  parseList(c, pod.Annotations, kubeinterface.AnnotationUUIDInclude),
		ExcludeUUIDs:  parseList(c, pod.Annotations, kubeinterface.AnnotationUUIDExclude),
	}
	checkDisjoint(c, kubeinterface.AnnotationModelInclude, sel.IncludeModels, sel.ExcludeModels)
	checkDisjoint(c, kubeinterface.AnnotationUUIDInclude, sel.IncludeUUIDs, sel.ExcludeUUIDs)

	var req types.PodRequest
	topology := types.TopologyPolicy(parseEnum(c, pod.Annotations, kubeinterface.AnnotationTopology, types.TopologyPolicies))
	req.Placement = types.PlacementPolicy(parseEnum(c, pod.Annotations, kubeinterface.AnnotationPlacement, types.PlacementPolicies))
	for _, key := range slices.Sorted(maps.Keys(pod.Annotations)) {
		if strings.HasPrefix(key, kubeinterface.Domain) && !userAnnotations[key] {
			c.add("", "annotation "+key, pod.Annotations[key], "one of the annotations kubegpu knows ("+strings.Join(knownAnnotationList(), ", ")+")")
		}
	}

	req.InitContainers = containerRequests(c, pod.Spec.InitContainers, sel, topology)
	req.Containers = containerRequests(c, pod.Spec.Containers, sel, topology)
	if err := c.err(); err != nil {
		return types.PodRequest{}, err
	}
	return req, nil
}

func containerRequests(c *collector, containers []corev1.Container, sel types.Selector, topology types.TopologyPolicy) []types.ContainerRequest {
	var out []types.ContainerRequest
	for i := range containers {
		ctr := &containers[i]
		count, hasCount := limit(c, ctr, kubeinterface.ResourceGPU, 0, MaxDevicesPerContainer, "an integer 1.."+fmt.Sprint(MaxDevicesPerContainer))
		mem, hasMem := limit(c, ctr, kubeinterface.ResourceGPUMemory, 1, MaxSliceMemoryMiB,
			fmt.Sprintf("a whole number of MiB, 1..%d (e.g. 4096 for 4 GiB)", MaxSliceMemoryMiB))
		cores, hasCores := limit(c, ctr, kubeinterface.ResourceGPUCores, 1, types.MaxComputePercent,
			fmt.Sprintf("an integer 1..%d (percent of one GPU's compute)", types.MaxComputePercent))
		if (hasMem || hasCores) && (!hasCount || count == 0) {
			name := kubeinterface.ResourceGPUMemory
			if !hasMem {
				name = kubeinterface.ResourceGPUCores
			}
			c.add(ctr.Name, string(kubeinterface.ResourceGPU), "", fmt.Sprintf("set to the number of slices (usually 1) when %s is set", name))
			continue
		}
		if count == 0 {
			continue
		}
		out = append(out, types.ContainerRequest{
			Name:           ctr.Name,
			Count:          int(count),
			MemoryMiB:      mem,
			ComputePercent: int(cores),
			Selector:       sel,
			Topology:       topology,
		})
	}
	return out
}

// limit reads a resource from the container's limits (or its requests, for a
// pod that sets only those) and checks it is an integer in [lo, hi]. It
// reports whether the resource is set at all.
func limit(c *collector, ctr *corev1.Container, name corev1.ResourceName, lo, hi int64, want string) (int64, bool) {
	q, ok := ctr.Resources.Limits[name]
	if !ok {
		q, ok = ctr.Resources.Requests[name]
	}
	if !ok {
		return 0, false
	}
	v, isInt := integer(q)
	if !isInt || v < lo || v > hi {
		c.add(ctr.Name, string(name), q.String(), want)
		return 0, true
	}
	return v, true
}

// integer returns q as an int64 if it is a whole, non-negative number that
// fits.
func integer(q resource.Quantity) (int64, bool) {
	if q.Sign() < 0 {
		return 0, false
	}
	if v, ok := q.AsInt64(); ok {
		return v, true
	}
	// AsInt64 refuses some exact integers written with a suffix ("1k").
	// Value rounds up, so accept it only if it is exact.
	if q.Cmp(*resource.NewQuantity(1<<50, resource.DecimalSI)) >= 0 {
		return 0, false
	}
	v := q.Value()
	if q.Cmp(*resource.NewQuantity(v, resource.DecimalSI)) != 0 {
		return 0, false
	}
	return v, true
}

// parseList splits a comma-separated annotation into its trimmed entries,
// dropping repeats.
func parseList(c *collector, annotations map[string]string, key string) []string {
	value, ok := annotations[key]
	if !ok {
		return nil
	}
	var out []string
	for _, part := range strings.Split(value, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			c.add("", "annotation "+key, value, "a comma-separated list with no empty entries")
			return nil
		}
		if !slices.ContainsFunc(out, func(s string) bool { return strings.EqualFold(s, part) }) {
			out = append(out, part)
		}
	}
	return out
}

// checkDisjoint reports entries that are both included and excluded.
func checkDisjoint(c *collector, includeKey string, include, exclude []string) {
	for _, in := range include {
		for _, ex := range exclude {
			if strings.EqualFold(in, ex) {
				c.add("", "annotation "+includeKey, in, "disjoint from the matching -exclude annotation")
			}
		}
	}
}

// parseEnum reads an optional annotation that must be one of allowed.
func parseEnum[T ~string](c *collector, annotations map[string]string, key string, allowed []T) string {
	value, ok := annotations[key]
	if !ok {
		return ""
	}
	for _, a := range allowed {
		if value == string(a) {
			return value
		}
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	c.add("", "annotation "+key, value, "one of "+strings.Join(names, ", "))
	return ""
}

func knownAnnotationList() []string { return slices.Sorted(maps.Keys(userAnnotations)) }
