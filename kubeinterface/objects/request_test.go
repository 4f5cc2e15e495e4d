package objects

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/types"
)

// container builds a container whose limits are the given name/value pairs.
func container(name string, limits ...string) corev1.Container {
	rl := corev1.ResourceList{}
	for i := 0; i+1 < len(limits); i += 2 {
		rl[corev1.ResourceName(limits[i])] = resource.MustParse(limits[i+1])
	}
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: rl}}
}

func pod(annotations map[string]string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train", Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func TestPodRequest(t *testing.T) {
	gpu, mem, cores := string(kubeinterface.ResourceGPU), string(kubeinterface.ResourceGPUMemory), string(kubeinterface.ResourceGPUCores)
	tests := []struct {
		name string
		pod  *corev1.Pod
		want types.PodRequest
	}{
		{
			name: "no gpus, annotations ignored",
			pod:  pod(map[string]string{kubeinterface.AnnotationTopology: "bogus"}, container("web", "cpu", "1")),
			want: types.PodRequest{},
		},
		{
			name: "whole gpus",
			pod:  pod(nil, container("train", gpu, "4")),
			want: types.PodRequest{Containers: []types.ContainerRequest{{Name: "train", Count: 4}}},
		},
		{
			name: "shared slice by memory and cores",
			pod:  pod(nil, container("infer", gpu, "1", mem, "4096", cores, "30")),
			want: types.PodRequest{Containers: []types.ContainerRequest{{Name: "infer", Count: 1, MemoryMiB: 4096, ComputePercent: 30}}},
		},
		{
			name: "two slices on distinct gpus by cores only",
			pod:  pod(nil, container("infer", gpu, "2", cores, "50")),
			want: types.PodRequest{Containers: []types.ContainerRequest{{Name: "infer", Count: 2, ComputePercent: 50}}},
		},
		{
			name: "constraints copied to every container",
			pod: pod(map[string]string{
				kubeinterface.AnnotationModelInclude: "Tesla V100-SXM2-16GB, A100-SXM4-40GB,a100-sxm4-40gb",
				kubeinterface.AnnotationUUIDExclude:  "GPU-1",
				kubeinterface.AnnotationTopology:     "required",
				kubeinterface.AnnotationPlacement:    "spread",
				"example.com/other":                  "kept out of the way",
			}, container("a", gpu, "2"), container("sidecar"), container("b", gpu, "1")),
			want: func() types.PodRequest {
				sel := types.Selector{IncludeModels: []string{"Tesla V100-SXM2-16GB", "A100-SXM4-40GB"}, ExcludeUUIDs: []string{"GPU-1"}}
				return types.PodRequest{
					Placement: types.PlacementSpread,
					Containers: []types.ContainerRequest{
						{Name: "a", Count: 2, Selector: sel, Topology: types.TopologyRequired},
						{Name: "b", Count: 1, Selector: sel, Topology: types.TopologyRequired},
					},
				}
			}(),
		},
		{
			name: "init container",
			pod: func() *corev1.Pod {
				p := pod(nil, container("main", gpu, "1"))
				p.Spec.InitContainers = []corev1.Container{container("warmup", gpu, "1")}
				return p
			}(),
			want: types.PodRequest{
				InitContainers: []types.ContainerRequest{{Name: "warmup", Count: 1}},
				Containers:     []types.ContainerRequest{{Name: "main", Count: 1}},
			},
		},
		{
			name: "requests only",
			pod: func() *corev1.Pod {
				p := pod(nil, corev1.Container{Name: "r"})
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1")}
				return p
			}(),
			want: types.PodRequest{Containers: []types.ContainerRequest{{Name: "r", Count: 1}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PodRequest(tt.pod)
			if err != nil {
				t.Fatalf("PodRequest() error = %v", err)
			}
			// Every container here asks with nvidia.com/gpu.
			for _, list := range [][]types.ContainerRequest{tt.want.InitContainers, tt.want.Containers} {
				for i := range list {
					list[i].Selector.Resource = types.ResourceNVIDIAGPU
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("PodRequest() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// manyModels is 63 model names, "Model-00" to "Model-62".
var manyModels = func() string {
	names := make([]string, 63)
	for i := range names {
		names[i] = fmt.Sprintf("Model-%02d", i)
	}
	return strings.Join(names, ",")
}()

func TestPodRequestErrors(t *testing.T) {
	gpu, mem, cores := string(kubeinterface.ResourceGPU), string(kubeinterface.ResourceGPUMemory), string(kubeinterface.ResourceGPUCores)
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string // every kubeinterface.FieldError message, in order
	}{
		{
			name: "cores out of range",
			pod:  pod(nil, container("train", gpu, "1", cores, "150")),
			want: []string{`container "train": kubegpu.io/gpu-cores must be an integer 1..100 (percent of one GPU's compute), got "150"`},
		},
		{
			name: "memory in bytes",
			pod:  pod(nil, container("train", gpu, "1", mem, "4Gi")),
			want: []string{`container "train": kubegpu.io/gpu-memory must be a whole number of MiB, 1..1048576 (e.g. 4096 for 4 GiB), got "4Gi"`},
		},
		{
			name: "fractional memory",
			pod:  pod(nil, container("train", gpu, "1", mem, "1500m")),
			want: []string{`container "train": kubegpu.io/gpu-memory must be a whole number of MiB, 1..1048576 (e.g. 4096 for 4 GiB), got "1500m"`},
		},
		{
			name: "almost one gpu",
			pod:  pod(nil, container("train", gpu, "0.9999")),
			want: []string{`container "train": nvidia.com/gpu must be an integer 1..64, got "999900u"`},
		},
		{
			name: "nano gpus",
			pod:  pod(nil, container("train", gpu, "999999999n")),
			want: []string{`container "train": nvidia.com/gpu must be an integer 1..64, got "999999999n"`},
		},
		{
			name: "huge negative wraps",
			pod:  pod(nil, container("train", gpu, "-18446744073709551611")),
			want: []string{`container "train": nvidia.com/gpu must be an integer 1..64, got "-18446744073709551611"`},
		},
		{
			name: "too many gpus",
			pod:  pod(nil, container("train", gpu, "65")),
			want: []string{`container "train": nvidia.com/gpu must be an integer 1..64, got "65"`},
		},
		{
			name: "slice without count",
			pod:  pod(nil, container("train", cores, "20")),
			want: []string{`container "train": nvidia.com/gpu or amd.com/gpu or gpu.intel.com/i915 or gpu.intel.com/xe must be set to the number of slices (usually 1) when kubegpu.io/gpu-cores is set, got ""`},
		},
		{
			name: "two device resources in one container",
			pod:  pod(nil, container("train", gpu, "1", "amd.com/gpu", "2")),
			want: []string{`the device resources the pod asks for must be one of nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915, gpu.intel.com/xe (a pod's GPUs are of one kind), got "nvidia.com/gpu, amd.com/gpu"`},
		},
		{
			name: "two device resources in two containers",
			pod:  pod(nil, container("cuda", gpu, "1"), container("rocm", "amd.com/gpu", "2"), container("more", "amd.com/gpu", "1")),
			want: []string{`the device resources the pod asks for must be one of nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915, gpu.intel.com/xe (a pod's GPUs are of one kind), got "nvidia.com/gpu, amd.com/gpu"`},
		},
		{
			name: "list too long, quoted by its prefix",
			pod:  pod(map[string]string{kubeinterface.AnnotationModelInclude: strings.Repeat("A100,", 1000)}, container("train", gpu, "1")),
			want: []string{`annotation kubegpu.io/gpu-model-include must be a comma-separated list of at most 4096 characters, got "` +
				strings.Repeat("A100,", 12) + `A100"... (5000 characters)`},
		},
		{
			name: "list with too many entries",
			pod: pod(map[string]string{kubeinterface.AnnotationUUIDExclude: func() string {
				var l []string
				for i := 0; i < 65; i++ {
					l = append(l, fmt.Sprintf("GPU-%d", i))
				}
				return strings.Join(l, ",")
			}()}, container("train", gpu, "1")),
			want: []string{`annotation kubegpu.io/gpu-uuid-exclude must be a comma-separated list of at most 64 entries, got "GPU-0,GPU-1,GPU-2,GPU-3,GPU-4,GPU-5,GPU-6,GPU-7,GPU-8,GPU-9,GPU-"... (444 characters)`},
		},
		{
			name: "terminal escape in a list is described, not echoed",
			pod:  pod(map[string]string{kubeinterface.AnnotationModelInclude: "T4\x1b[2J", kubeinterface.AnnotationTopology: "\u202erequired"}, container("train", gpu, "1")),
			want: []string{
				`annotation kubegpu.io/gpu-model-include must be a comma-separated list of printable ASCII entries, got (6 characters, not all printable ASCII)`,
				`annotation kubegpu.io/topology must be one of required, preferred, none, got (9 characters, not all printable ASCII)`,
			},
		},
		{
			name: "too many containers with gpus",
			pod: func() *corev1.Pod {
				var cs []corev1.Container
				for i := 0; i < 17; i++ {
					cs = append(cs, container(fmt.Sprintf("c%d", i), gpu, "1"))
				}
				return pod(nil, cs...)
			}(),
			want: []string{`the number of containers asking for GPUs must be at most 16, got "17"`},
		},
		{
			name: "no grace period",
			pod: func() *corev1.Pod {
				p := pod(nil, container("train", gpu, "1"))
				p.Spec.TerminationGracePeriodSeconds = new(int64)
				return p
			}(),
			want: []string{`spec.terminationGracePeriodSeconds must be at least 1 for a pod with GPUs (deleted with no grace period, a pod would free its GPUs while its containers may still run), got "0"`},
		},
		{
			name: "bad annotations all reported",
			pod: pod(map[string]string{
				kubeinterface.AnnotationTopology:     "strict",
				kubeinterface.AnnotationPlacement:    "pack",
				kubeinterface.AnnotationModelInclude: "T4,,V100",
				kubeinterface.AnnotationUUIDInclude:  "GPU-1",
				kubeinterface.AnnotationUUIDExclude:  "gpu-1",
				kubeinterface.Domain + "topolgy":     "required",
			}, container("train", gpu, "1")),
			want: []string{
				`annotation kubegpu.io/gpu-model-include must be a comma-separated list with no empty entries, got "T4,,V100"`,
				`annotation kubegpu.io/gpu-uuid-include must be disjoint from the matching -exclude annotation, got "GPU-1"`,
				`annotation kubegpu.io/topology must be one of required, preferred, none, got "strict"`,
				`annotation kubegpu.io/placement must be one of binpack, spread, got "pack"`,
				`annotation kubegpu.io/topolgy must be one of the annotations kubegpu knows (kubegpu.io/allocation, kubegpu.io/gpu-model-exclude, kubegpu.io/gpu-model-include, kubegpu.io/gpu-uuid-exclude, kubegpu.io/gpu-uuid-include, kubegpu.io/placement, kubegpu.io/topology), got "required"`,
			},
		},
		{
			// Every overlapping entry in one error, its quote bounded.
			name: "many overlaps quoted once",
			pod: pod(map[string]string{
				kubeinterface.AnnotationModelInclude: manyModels,
				kubeinterface.AnnotationModelExclude: strings.ToLower(manyModels),
			}, container("train", gpu, "1")),
			want: []string{`annotation kubegpu.io/gpu-model-include must be disjoint from the matching -exclude annotation, got ` +
				kubeinterface.Quote(manyModels)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PodRequest(tt.pod)
			if !errors.Is(err, kubeinterface.ErrInvalid) {
				t.Fatalf("PodRequest() error = %v, want kubeinterface.ErrInvalid", err)
			}
			var inv *kubeinterface.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("PodRequest() error is %T, want *kubeinterface.InvalidError", err)
			}
			var got []string
			for _, f := range inv.Fields {
				got = append(got, f.Error())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("field errors =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			if !strings.HasPrefix(err.Error(), "pod default/train: ") {
				t.Errorf("error %q does not name the pod", err)
			}
			var fe *kubeinterface.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("errors.As(*kubeinterface.FieldError) failed on %v", err)
			}
		})
	}
}

func TestWantsDevices(t *testing.T) {
	if WantsDevices(pod(nil, container("web", "cpu", "2"))) {
		t.Error("cpu-only pod wants devices")
	}
	if WantsDevices(pod(nil, container("zero", string(kubeinterface.ResourceGPU), "0"))) {
		t.Error("pod with nvidia.com/gpu: 0 wants devices")
	}
	if !WantsDevices(pod(nil, container("web"), container("gpu", string(kubeinterface.ResourceGPU), "1"))) {
		t.Error("gpu pod does not want devices")
	}
}

// A container asks for another vendor's GPUs with that vendor's resource;
// its slices too.
func TestPodRequestDeviceResources(t *testing.T) {
	p := pod(nil, container("rocm", "amd.com/gpu", "4"), container("cores", "amd.com/gpu", "1", "kubegpu.io/gpu-cores", "30"),
		container("slice", "amd.com/gpu", "1", "kubegpu.io/gpu-memory", "8192"))
	got, err := PodRequest(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []types.ContainerRequest{
		{Name: "rocm", Count: 4, Selector: types.Selector{Resource: types.ResourceAMDGPU}},
		{Name: "cores", Count: 1, ComputePercent: 30, Selector: types.Selector{Resource: types.ResourceAMDGPU}},
		{Name: "slice", Count: 1, MemoryMiB: 8192, Selector: types.Selector{Resource: types.ResourceAMDGPU}},
	}
	if !reflect.DeepEqual(got.Containers, want) {
		t.Errorf("PodRequest() =\n%+v\nwant\n%+v", got.Containers, want)
	}
	if !WantsDevices(pod(nil, container("rocm", "amd.com/gpu", "1"))) {
		t.Error("WantsDevices of an amd.com/gpu pod = false")
	}
}

// TestPodRequestGAS: Intel GPU Aware Scheduling's millicores and
// memory.max are the container's totals, split over its Intel GPUs, each
// GPU's part rounded up to a whole millicore and byte, and then to a
// slice of whole per cent and MiB; where they do not apply, the error
// says why.
func TestPodRequestGAS(t *testing.T) {
	const (
		i915  = "gpu.intel.com/i915"
		xe    = "gpu.intel.com/xe"
		milli = "gpu.intel.com/millicores"
		mem   = "gpu.intel.com/memory.max"
	)
	got, err := PodRequest(pod(nil, container("a", i915, "2", milli, "1000", mem, "8Gi"), container("b", i915, "1", milli, "255"),
		container("c", i915, "4", milli, "3", mem, "3")))
	if err != nil {
		t.Fatal(err)
	}
	want := []types.ContainerRequest{
		{Name: "a", Count: 2, ComputePercent: 50, MemoryMiB: 4096, Selector: types.Selector{Resource: types.ResourceIntelI915}},
		{Name: "b", Count: 1, ComputePercent: 26, Selector: types.Selector{Resource: types.ResourceIntelI915}},
		{Name: "c", Count: 4, ComputePercent: 1, MemoryMiB: 1, Selector: types.Selector{Resource: types.ResourceIntelI915}},
	}
	if !reflect.DeepEqual(got.Containers, want) {
		t.Errorf("PodRequest() =\n%+v\nwant\n%+v", got.Containers, want)
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"over 1000 per GPU", pod(nil, container("c", xe, "1", milli, "1500")),
			`container "c": gpu.intel.com/millicores must be at most 1000 per GPU (the container's total divided by its GPU count), got "1500"`},
		{"over 1000 per GPU, rounded up", pod(nil, container("c", xe, "2", milli, "2001")),
			`container "c": gpu.intel.com/millicores must be at most 1000 per GPU`},
		{"over the memory of a slice", pod(nil, container("c", xe, "1", mem, "1099511627777")),
			`container "c": gpu.intel.com/memory.max must be at most 1048576 MiB per GPU`},
		{"not Intel", pod(nil, container("c", "nvidia.com/gpu", "1", milli, "500")),
			`container "c": gpu.intel.com/millicores must be set only with gpu.intel.com/i915 or gpu.intel.com/xe`},
		{"two ways", pod(nil, container("c", i915, "1", milli, "500", "kubegpu.io/gpu-cores", "50")),
			`container "c": gpu.intel.com/millicores must be unset where kubegpu.io/gpu-memory or kubegpu.io/gpu-cores is set`},
		{"no count", pod(nil, container("c", mem, "1Gi")),
			`container "c": nvidia.com/gpu or amd.com/gpu or gpu.intel.com/i915 or gpu.intel.com/xe must be set to the number of slices (usually 1) when gpu.intel.com/memory.max is set, got ""`},
		{"tiles", pod(nil, container("c", i915, "1", "gpu.intel.com/tiles", "2")),
			`container "c": gpu.intel.com/tiles must be unset: kubegpu places whole Intel GPUs or slices of them`},
		{"not an integer", pod(nil, container("c", i915, "1", milli, "100m")),
			`container "c": gpu.intel.com/millicores must be an integer 1..64000`},
	} {
		_, err := PodRequest(tc.pod)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
