package objects

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// Bounds of what a pod may ask for. The shipped admission policy
// (deploy/admission) checks the same bounds with the same words at creation.
const (
	// MaxDevicesPerContainer bounds each device resource (nvidia.com/gpu,
	// amd.com/gpu).
	MaxDevicesPerContainer = 64
	// MaxSliceMemoryMiB bounds kubegpu.io/gpu-memory (1 TiB).
	MaxSliceMemoryMiB = 1 << 20
	// MaxListChars bounds each model or UUID list annotation.
	MaxListChars = 4096
	// MaxListEntries bounds the entries of each model or UUID list.
	MaxListEntries = 64
)

// What the rules' error messages say a valid value is ("... must be WANT,
// got VALUE"); deploy/admission's policy is generated from the same texts.
var (
	WantDeviceCount      = fmt.Sprintf("an integer 1..%d", MaxDevicesPerContainer)
	WantSliceMemory      = fmt.Sprintf("a whole number of MiB, 1..%d (e.g. 4096 for 4 GiB)", MaxSliceMemoryMiB)
	WantSliceCores       = fmt.Sprintf("an integer 1..%d (percent of one GPU's compute)", types.MaxComputePercent)
	WantListChars        = fmt.Sprintf("a comma-separated list of at most %d characters", MaxListChars)
	WantListASCII        = "a comma-separated list of printable ASCII entries"
	WantListNoEmpty      = "a comma-separated list with no empty entries"
	WantListEntries      = fmt.Sprintf("a comma-separated list of at most %d entries", MaxListEntries)
	WantDisjoint         = "disjoint from the matching -exclude annotation"
	WantKnownAnnotation  = "one of the annotations kubegpu knows (" + strings.Join(KnownAnnotations(), ", ") + ")"
	WantDeviceContainers = fmt.Sprintf("at most %d", types.MaxDeviceContainers)
	WantGracePeriod      = "at least 1 for a pod with GPUs (deleted with no grace period, a pod would free its GPUs while its containers may still run)"
	WantOneResource      = "one of " + strings.Join(types.DeviceResources(), ", ") + " (a pod's GPUs are of one kind)"
	WantMillicores       = fmt.Sprintf("an integer 1..%d (thousandths of a GPU, the container's total over its GPUs)", 1000*MaxDevicesPerContainer)
	WantMemoryMax        = fmt.Sprintf("a whole number of bytes, 1..%d (the container's total over its GPUs, e.g. 8Gi)", MaxMemoryMaxBytes)
	WantNoTiles          = "unset: kubegpu places whole Intel GPUs or slices of them (" + kubeinterface.ResourceIntelMillicores + ", " + kubeinterface.ResourceIntelMemoryMax + "), not tiles"
	WantOneSliceWay      = "unset where " + kubeinterface.ResourceGPUMemory + " or " + kubeinterface.ResourceGPUCores + " is set (one way to ask for a slice per container)"
	WantIntelCount       = "set only with " + types.ResourceIntelI915 + " or " + types.ResourceIntelXe + " (GPU Aware Scheduling's split of a container's total over its Intel GPUs)"
	WantMillicoresPerGPU = "at most 1000 per GPU (the container's total divided by its GPU count)"
	WantMemoryMaxPerGPU  = fmt.Sprintf("at most %d MiB per GPU (the container's total divided by its GPU count)", MaxSliceMemoryMiB)
)

// MaxMemoryMaxBytes bounds gpu.intel.com/memory.max: the most memory of
// MaxDevicesPerContainer slices.
const MaxMemoryMaxBytes = int64(MaxSliceMemoryMiB) << 20 * MaxDevicesPerContainer

// sliceResources are the resources that make a container's request
// slices, in the order the rule for a slice without a count names the
// first one set.
var sliceResources = []corev1.ResourceName{kubeinterface.ResourceGPUMemory, kubeinterface.ResourceGPUCores,
	kubeinterface.ResourceIntelMillicores, kubeinterface.ResourceIntelMemoryMax}

// intelResources are the device resources GAS's resources go with.
var intelResources = []string{types.ResourceIntelI915, types.ResourceIntelXe}

// Fields of the rules that are not a container's resource or an annotation.
const (
	FieldDeviceContainers = "the number of containers asking for GPUs"
	FieldGracePeriod      = "spec.terminationGracePeriodSeconds"
	FieldDeviceResources  = "the device resources the pod asks for"
)

// FieldSliceCount names the device resources in the error of a slice
// without a count: one of them must be set.
var FieldSliceCount = strings.Join(types.DeviceResources(), " or ")

// WantSliceCount is what a device resource must be when the slice resource
// name is set.
func WantSliceCount(name string) string {
	return "set to the number of slices (usually 1) when " + name + " is set"
}

// ListAnnotations are the model and UUID list annotations, in the order
// their errors are reported.
var ListAnnotations = []string{kubeinterface.AnnotationModelInclude, kubeinterface.AnnotationModelExclude,
	kubeinterface.AnnotationUUIDInclude, kubeinterface.AnnotationUUIDExclude}

// RequestResources are the resources a container asks for GPUs with: the
// device resources (types.DeviceResources) and the slices' memory and
// cores.
var RequestResources = func() []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, r := range types.DeviceResources() {
		out = append(out, corev1.ResourceName(r))
	}
	return append(out, kubeinterface.ResourceGPUMemory, kubeinterface.ResourceGPUCores,
		kubeinterface.ResourceIntelMillicores, kubeinterface.ResourceIntelMemoryMax, kubeinterface.ResourceIntelTiles)
}()

// ServedByDRA reports whether DRA serves the pod's extended resources (the
// scheduler's DynamicResources plugin recorded the claim it allocated for
// them in the pod's status): a pod bound so holds no kubegpu allocation,
// and needs none.
func ServedByDRA(pod *corev1.Pod) bool { return pod.Status.ExtendedResourceClaimStatus != nil }

// WantsDevices reports cheaply whether any container of the pod asks for
// GPUs, so that callers can skip non-GPU pods before decoding anything.
func WantsDevices(pod *corev1.Pod) bool { return AsksFor(pod, RequestResources...) }

// AsksFor reports whether a container of the pod asks for any of names
// (a non-zero limit or request).
func AsksFor(pod *corev1.Pod, names ...corev1.ResourceName) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			for _, rl := range []corev1.ResourceList{list[i].Resources.Limits, list[i].Resources.Requests} {
				for _, name := range names {
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
// reported at once in an *kubeinterface.InvalidError, which wraps
// kubeinterface.ErrInvalid.
//
// Its cost is linear in the size of the pod, and every value it accepts is
// bounded (see MaxListChars and the other bounds), whatever the pod says.
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
	var unknown []string
	for key := range pod.Annotations {
		if strings.HasPrefix(key, kubeinterface.Domain) && !userAnnotations[key] {
			unknown = append(unknown, key)
		}
	}
	slices.Sort(unknown)
	for _, key := range unknown {
		c.add("", "annotation "+key, pod.Annotations[key], WantKnownAnnotation)
	}

	var asked []string
	counted := 0 // the containers that ask for a number of devices
	req.InitContainers = containerRequests(c, pod.Spec.InitContainers, sel, topology, &asked, &counted)
	req.Containers = containerRequests(c, pod.Spec.Containers, sel, topology, &asked, &counted)
	if len(asked) > 1 {
		c.add("", FieldDeviceResources, strings.Join(asked, ", "), WantOneResource)
	}
	if n := counted; n > types.MaxDeviceContainers {
		c.add("", FieldDeviceContainers, fmt.Sprint(n), WantDeviceContainers)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < 1 {
		c.add("", FieldGracePeriod, fmt.Sprint(*g), WantGracePeriod)
	}
	if err := c.err(); err != nil {
		return types.PodRequest{}, err
	}
	return req, nil
}

// containerRequests decodes the containers' requests; asked gathers the
// device resources they ask for, each once, in the order they appear, and
// counted the containers that ask for a number of devices (valid or not
// otherwise).
func containerRequests(c *collector, containers []corev1.Container, sel types.Selector, topology types.TopologyPolicy, asked *[]string, counted *int) []types.ContainerRequest {
	var out []types.ContainerRequest
	for i := range containers {
		ctr := &containers[i]
		var count int64
		var hasCount bool
		for _, r := range types.DeviceResources() {
			n, has := limit(c, ctr, corev1.ResourceName(r), 0, MaxDevicesPerContainer, WantDeviceCount)
			if has && n > 0 {
				if !slices.Contains(*asked, r) {
					*asked = append(*asked, r)
				}
				count, hasCount, sel.Resource = n, true, r
			}
		}
		mem, hasMem := limit(c, ctr, kubeinterface.ResourceGPUMemory, 1, MaxSliceMemoryMiB, WantSliceMemory)
		cores, hasCores := limit(c, ctr, kubeinterface.ResourceGPUCores, 1, types.MaxComputePercent, WantSliceCores)
		milli, hasMilli := limit(c, ctr, kubeinterface.ResourceIntelMillicores, 1, 1000*MaxDevicesPerContainer, WantMillicores)
		memMax, hasMemMax := limit(c, ctr, kubeinterface.ResourceIntelMemoryMax, 1, MaxMemoryMaxBytes, WantMemoryMax)
		if q, ok := quantity(ctr, kubeinterface.ResourceIntelTiles); ok {
			c.add(ctr.Name, kubeinterface.ResourceIntelTiles, q.String(), WantNoTiles)
		}
		if hasCount {
			*counted++
		}
		gas := hasMilli || hasMemMax
		switch {
		case gas && (hasMem || hasCores):
			name := kubeinterface.ResourceIntelMillicores
			if !hasMilli {
				name = kubeinterface.ResourceIntelMemoryMax
			}
			c.add(ctr.Name, name, "", WantOneSliceWay)
			continue
		case (hasMem || hasCores || gas) && !hasCount:
			set := []bool{hasMem, hasCores, hasMilli, hasMemMax}
			name := sliceResources[slices.Index(set, true)]
			c.add(ctr.Name, FieldSliceCount, "", WantSliceCount(string(name)))
			continue
		case !hasCount:
			continue
		case gas && !slices.Contains(intelResources, sel.Resource):
			name := kubeinterface.ResourceIntelMillicores
			if !hasMilli {
				name = kubeinterface.ResourceIntelMemoryMax
			}
			c.add(ctr.Name, name, "", WantIntelCount)
			continue
		}
		// GAS's totals, split over the GPUs, each part rounded up (GAS
		// rounds down: at most a millicore and a byte more a GPU here, so
		// that the parts placed never add up to less than the total kubelet
		// counts); a slice's compute in whole per cent, its memory in whole
		// MiB, rounded up too.
		if milli > 0 {
			per := (milli + count - 1) / count
			if per > 1000 {
				q, _ := quantity(ctr, kubeinterface.ResourceIntelMillicores)
				c.add(ctr.Name, kubeinterface.ResourceIntelMillicores, q.String(), WantMillicoresPerGPU)
				continue
			}
			cores = (per + 9) / 10
		}
		if memMax > 0 {
			per := ((memMax+count-1)/count + 1<<20 - 1) >> 20
			if per > MaxSliceMemoryMiB {
				q, _ := quantity(ctr, kubeinterface.ResourceIntelMemoryMax)
				c.add(ctr.Name, kubeinterface.ResourceIntelMemoryMax, q.String(), WantMemoryMaxPerGPU)
				continue
			}
			mem = per
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

// quantity is a resource of the container's limits, or of its requests
// for a pod that sets only those.
func quantity(ctr *corev1.Container, name corev1.ResourceName) (resource.Quantity, bool) {
	q, ok := ctr.Resources.Limits[name]
	if !ok {
		q, ok = ctr.Resources.Requests[name]
	}
	return q, ok
}

// limit reads a resource from the container's limits (or its requests, for a
// pod that sets only those) and checks it is an integer in [lo, hi]. It
// reports whether the resource is set at all.
func limit(c *collector, ctr *corev1.Container, name corev1.ResourceName, lo, hi int64, want string) (int64, bool) {
	q, ok := quantity(ctr, name)
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
// fits: exactly what the admission policy's quantity(v).isInteger() and
// asInteger() accept.
func integer(q resource.Quantity) (int64, bool) {
	if q.Sign() < 0 {
		return 0, false
	}
	// As the API server stores it: a Quantity built in memory ("1000m")
	// may be held in a form AsInt64 refuses where the stored one ("1")
	// is accepted.
	canonical, err := resource.ParseQuantity(q.String())
	if err != nil {
		return 0, false
	}
	return canonical.AsInt64()
}

// parseList splits a comma-separated annotation into its trimmed entries,
// dropping repeats (compared case-insensitively, the first spelling kept).
// A list is at most MaxListChars characters of printable ASCII with at most
// MaxListEntries entries, none empty; the first rule broken is reported and
// the list is dropped.
func parseList(c *collector, annotations map[string]string, key string) []string {
	value, ok := annotations[key]
	if !ok {
		return nil
	}
	field := "annotation " + key
	switch {
	case utf8.RuneCountInString(value) > MaxListChars:
		c.add("", field, value, WantListChars)
		return nil
	case !kubeinterface.PrintableASCII(value):
		c.add("", field, value, WantListASCII)
		return nil
	}
	parts := strings.Split(value, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
		if parts[i] == "" {
			c.add("", field, value, WantListNoEmpty)
			return nil
		}
	}
	if len(parts) > MaxListEntries {
		c.add("", field, value, WantListEntries)
		return nil
	}
	seen := make(map[string]bool, len(parts))
	out := parts[:0]
	for _, p := range parts {
		if l := strings.ToLower(p); !seen[l] {
			seen[l] = true
			out = append(out, p)
		}
	}
	return out
}

// checkDisjoint reports the entries that are both included and excluded,
// in one error (whose quote of them is bounded).
func checkDisjoint(c *collector, includeKey string, include, exclude []string) {
	if len(include) == 0 || len(exclude) == 0 {
		return
	}
	excluded := make(map[string]bool, len(exclude))
	for _, ex := range exclude {
		excluded[strings.ToLower(ex)] = true
	}
	var both []string
	for _, in := range include {
		if excluded[strings.ToLower(in)] {
			both = append(both, in)
		}
	}
	if len(both) > 0 {
		c.add("", "annotation "+includeKey, strings.Join(both, ","), WantDisjoint)
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

// KnownAnnotations lists, sorted, every kubegpu.io/ annotation a pod may
// carry: those a user sets and the scheduler's allocation.
func KnownAnnotations() []string { return slices.Sorted(maps.Keys(userAnnotations)) }
