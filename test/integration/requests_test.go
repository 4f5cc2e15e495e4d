package integration

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// TestAttackMalformedRequestsAtCreation (point 4, policy
// kubegpu-gpu-request): a GPU request PreFilter would refuse is refused at
// creation with PreFilter's words: the same pods through the API server
// and through the Go rules, a table and random ones.
func TestAttackMalformedRequestsAtCreation(t *testing.T) {
	ctx := context.Background()
	ns := namespace(ctx, t, "requests")
	tc := tenant(t, ns)
	long := strings.Repeat("A100,", 900)
	table := []*corev1.Pod{
		gpuPod("whole", 2, 0, 0, nil),
		gpuPod("cores-150", 1, 150, 0, nil),
		gpuPod("memory-huge", 1, 0, 2<<20, nil),
		gpuPod("gpus-65", 65, 0, 0, nil),
		gpuPod("ok-annotations", 1, 0, 0, map[string]string{kubeinterface.AnnotationModelInclude: "Tesla T4, a100,A100", kubeinterface.AnnotationTopology: "none",
			kubeinterface.AnnotationPlacement: "spread"}),
		gpuPod("bad-annotations", 1, 0, 0, map[string]string{kubeinterface.AnnotationTopology: "strict", kubeinterface.AnnotationPlacement: "pack",
			kubeinterface.AnnotationModelInclude: "T4,,V100", kubeinterface.AnnotationUUIDInclude: "GPU-1,gpu-2", kubeinterface.AnnotationUUIDExclude: "gpu-1, GPU-2",
			kubeinterface.Domain + "topolgy": "required"}),
		gpuPod("long-list", 1, 0, 0, map[string]string{kubeinterface.AnnotationModelExclude: long}),
		// Every entry included and excluded: one bounded error, not 63.
		func() *corev1.Pod {
			models := make([]string, 63)
			for i := range models {
				models[i] = fmt.Sprintf("Tesla-V100-SXM2-16GB-%02d", i)
			}
			return gpuPod("many-overlaps", 1, 0, 0, map[string]string{kubeinterface.AnnotationModelInclude: strings.Join(models, ","),
				kubeinterface.AnnotationModelExclude: strings.ToLower(strings.Join(models, ","))})
		}(),
		gpuPod("escape", 1, 0, 0, map[string]string{kubeinterface.AnnotationModelInclude: "T4\x1b[2J", kubeinterface.AnnotationTopology: "\u202erequired"}),
		gpuPod("not-gpu", 0, 0, 0, map[string]string{kubeinterface.AnnotationTopology: "strict"}),
		func() *corev1.Pod {
			p := gpuPod("slice-without-count", 1, 20, 0, nil)
			delete(p.Spec.Containers[0].Resources.Limits, kubeinterface.ResourceGPU)
			return p
		}(),
		// Another vendor's GPUs, whole and sliced; two vendors in one
		// container; a count out of bounds.
		amdPod("amd-whole", "2", nil),
		amdPod("amd-slice", "1", corev1.ResourceList{kubeinterface.ResourceGPUCores: resource.MustParse("20")}),
		amdPod("amd-65", "65", nil),
		amdPod("two-vendors", "1", corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1")}),
		// GPU Aware Scheduling's totals: split over Intel GPUs, or refused.
		intelPod("gas", "2", corev1.ResourceList{kubeinterface.ResourceIntelMillicores: resource.MustParse("1000"), kubeinterface.ResourceIntelMemoryMax: resource.MustParse("8Gi")}),
		intelPod("gas-1500", "1", corev1.ResourceList{kubeinterface.ResourceIntelMillicores: resource.MustParse("1500")}),
		intelPod("gas-tiny", "4", corev1.ResourceList{kubeinterface.ResourceIntelMemoryMax: resource.MustParse("3")}),
		intelPod("gas-tiles", "1", corev1.ResourceList{kubeinterface.ResourceIntelTiles: resource.MustParse("2")}),
		intelPod("gas-two-ways", "1", corev1.ResourceList{kubeinterface.ResourceIntelMillicores: resource.MustParse("500"), kubeinterface.ResourceGPUCores: resource.MustParse("50")}),
		amdPod("gas-on-amd", "1", corev1.ResourceList{kubeinterface.ResourceIntelMillicores: resource.MustParse("500")}),
		func() *corev1.Pod {
			p := intelPod("gas-no-count", "1", corev1.ResourceList{kubeinterface.ResourceIntelMemoryMax: resource.MustParse("1Gi")})
			delete(p.Spec.Containers[0].Resources.Limits, types.ResourceIntelI915)
			return p
		}(),
		intelPod("gas-huge", "1", corev1.ResourceList{kubeinterface.ResourceIntelMemoryMax: resource.MustParse("100Ti")}),
		func() *corev1.Pod {
			p := amdPod("two-vendors-apart", "2", nil)
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{types.ResourceIntelXe: resource.MustParse("1")}}}}
			return p
		}(),
		func() *corev1.Pod {
			// Sixteen containers of one kind and one asking for two: the
			// count and the kinds, each said once.
			p := amdPod("seventeen-two-kinds", "1", corev1.ResourceList{kubeinterface.ResourceGPU: resource.MustParse("1")})
			for i := range 16 {
				c := *p.Spec.Containers[0].DeepCopy()
				c.Name = fmt.Sprintf("c%d", i)
				delete(c.Resources.Limits, kubeinterface.ResourceGPU)
				p.Spec.Containers = append(p.Spec.Containers, c)
			}
			return p
		}(),
		func() *corev1.Pod {
			p := gpuPod("seventeen", 1, 0, 0, nil)
			for i := range 16 {
				c := *p.Spec.Containers[0].DeepCopy()
				c.Name = fmt.Sprintf("c%d", i)
				p.Spec.Containers = append(p.Spec.Containers, c)
			}
			return p
		}(),
		func() *corev1.Pod {
			p := gpuPod("init-bad", 1, 0, 0, nil)
			c := *p.Spec.Containers[0].DeepCopy()
			c.Name = "init"
			c.Resources.Limits[kubeinterface.ResourceGPUCores] = resource.MustParse("0")
			p.Spec.InitContainers = []corev1.Container{c}
			return p
		}(),
	}
	rng := rand.New(rand.NewPCG(42, 13))
	for i := range 150 {
		table = append(table, randomPod(rng, fmt.Sprintf("random-%03d", i)))
	}
	refusedCount := 0
	for _, p := range table {
		p.Namespace = ns
		_, apiErr := tc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		_, goErr := objects.PodRequest(p)
		switch {
		case goErr == nil && apiErr != nil:
			t.Errorf("pod %s: PreFilter accepts it, admission refuses it: %v", p.Name, apiErr)
		case goErr != nil && apiErr == nil:
			t.Errorf("pod %s: admission accepts it, PreFilter refuses it: %v", p.Name, goErr)
		case goErr != nil:
			refusedCount++
			if !strings.Contains(apiErr.Error(), "kubegpu-gpu-request") || !strings.Contains(apiErr.Error(), "denied request: "+goErr.Error()) {
				t.Errorf("pod %s: admission says\n  %v\nPreFilter says\n  %v", p.Name, apiErr, goErr)
			}
			// Every error quotes at most 64 characters of a value: a
			// refusal of a few containers' errors stays short.
			if n := len(goErr.Error()); n > 4096 {
				t.Errorf("pod %s: a refusal of %d bytes: %.300s...", p.Name, n, goErr)
			}
		}
	}
	t.Logf("%d pods, %d refused by both with the same words", len(table), refusedCount)
	if refusedCount < 20 {
		t.Errorf("only %d of %d pods refused: the random pods do not exercise the rules", refusedCount, len(table))
	}
}

// amdPod is a pod whose container asks for count amd.com/gpu, and more.
func amdPod(name, count string, more corev1.ResourceList) *corev1.Pod {
	limits := corev1.ResourceList{types.ResourceAMDGPU: resource.MustParse(count)}
	maps.Copy(limits, more)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{Limits: limits}}}}}
}

// intelPod is a pod whose container asks for count gpu.intel.com/i915,
// and more.
func intelPod(name, count string, more corev1.ResourceList) *corev1.Pod {
	p := amdPod(name, count, more)
	l := p.Spec.Containers[0].Resources.Limits
	l[types.ResourceIntelI915] = l[types.ResourceAMDGPU]
	delete(l, types.ResourceAMDGPU)
	return p
}

// randomPod is a GPU pod with random, mostly plausible, values.
func randomPod(rng *rand.Rand, name string) *corev1.Pod {
	pick := func(vals ...string) string { return vals[rng.IntN(len(vals))] }
	ann := map[string]string{}
	for _, key := range []string{kubeinterface.AnnotationModelInclude, kubeinterface.AnnotationModelExclude, kubeinterface.AnnotationUUIDInclude, kubeinterface.AnnotationUUIDExclude} {
		if rng.IntN(3) == 0 {
			ann[key] = pick("Tesla T4", "T4, V100", "a,A", "x,,y", " ", "", "GPU-1, gpu-1", strings.Repeat("m,", 70)+"m", "é", "T4\t", "A100-SXM4-40GB")
		}
	}
	if rng.IntN(3) == 0 {
		ann[kubeinterface.AnnotationTopology] = pick("required", "preferred", "none", "Required", "strict", "")
	}
	if rng.IntN(4) == 0 {
		ann[kubeinterface.AnnotationPlacement] = pick("binpack", "spread", "pack", strings.Repeat("x", 100))
	}
	if rng.IntN(6) == 0 {
		ann[kubeinterface.Domain+pick("gpu-model", "zzz", "Topology")] = "x"
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
	for i := range 1 + rng.IntN(3) {
		limits := corev1.ResourceList{}
		if rng.IntN(5) != 0 {
			limits[kubeinterface.ResourceGPU] = resource.MustParse(pick("1", "2", "0", "8", "64", "65", "100", "1k", "1000m", "2e0"))
		}
		if rng.IntN(4) == 0 {
			limits[types.ResourceAMDGPU] = resource.MustParse(pick("1", "4", "0", "65", "1000m"))
		}
		if rng.IntN(4) == 0 {
			limits[corev1.ResourceName(pick(types.ResourceIntelI915, types.ResourceIntelXe))] = resource.MustParse(pick("1", "2", "3", "0", "65"))
		}
		if rng.IntN(4) == 0 {
			limits[kubeinterface.ResourceIntelMillicores] = resource.MustParse(pick("1000", "1", "2001", "0", "64001", "3000"))
		}
		if rng.IntN(5) == 0 {
			limits[kubeinterface.ResourceIntelMemoryMax] = resource.MustParse(pick("8Gi", "1", "0", "100Ti", "3"))
		}
		if rng.IntN(12) == 0 {
			limits[kubeinterface.ResourceIntelTiles] = resource.MustParse(pick("1", "2"))
		}
		if rng.IntN(3) == 0 {
			limits[kubeinterface.ResourceGPUCores] = resource.MustParse(pick("30", "100", "101", "0", "1"))
		}
		if rng.IntN(3) == 0 {
			limits[kubeinterface.ResourceGPUMemory] = resource.MustParse(pick("4096", "1", "1048576", "1048577", "1Ki", "1M"))
		}
		c := corev1.Container{Name: fmt.Sprintf("c%d", i), Image: "busybox", Resources: corev1.ResourceRequirements{Limits: limits}}
		if i == 0 || rng.IntN(2) == 0 {
			p.Spec.Containers = append(p.Spec.Containers, c)
		} else {
			p.Spec.InitContainers = append(p.Spec.InitContainers, c)
		}
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "main", Image: "busybox"}}
	}
	if rng.IntN(8) == 0 {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(rng.IntN(2)))
	}
	return p
}
