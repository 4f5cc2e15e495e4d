package kubeinterface

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fuzz tests check the decoders' promises on any input: no panic, an
// error that wraps ErrInvalid or a value that survives a round trip.

func FuzzDecodeInventory(f *testing.F) {
	good, err := EncodeInventory(bigInventory())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(`{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":[{"id":"gpu0","uuid":"u","health":"Healthy"}],"links":[{"a":"gpu0","b":"gpu0","kind":"NVLink"}]}`)
	f.Add(`{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":null}`)
	f.Add(`[]`)
	f.Add(``)
	f.Fuzz(func(t *testing.T, value string) {
		inv, err := DecodeInventory(value)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeInventory() error %v does not wrap ErrInvalid", err)
			}
			return
		}
		_ = inv.LinkMatrix() // must not panic on a valid inventory
		again, err := EncodeInventory(inv)
		if err != nil {
			t.Fatalf("decoded inventory does not encode: %v", err)
		}
		assertStable(t, again, func(s string) (string, error) {
			inv, err := DecodeInventory(s)
			if err != nil {
				return "", err
			}
			return EncodeInventory(inv)
		})
	})
}

func FuzzDecodeAllocation(f *testing.F) {
	good, err := EncodeAllocation(testAllocation())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(`{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","pod":{"namespace":"a","name":"b","uid":"c"},"node":"n","containers":[{"name":"x","devices":[{"id":"g","uuid":"u","computePercent":-1}]}]}`)
	f.Add(`{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation","signature":7}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, value string) {
		a, err := DecodeAllocation(value)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeAllocation() error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := EncodeAllocation(a)
		if err != nil {
			t.Fatalf("decoded allocation does not encode: %v", err)
		}
		assertStable(t, again, func(s string) (string, error) {
			a, err := DecodeAllocation(s)
			if err != nil {
				return "", err
			}
			return EncodeAllocation(a)
		})
	})
}

func FuzzPodRequest(f *testing.F) {
	f.Add("1", "4096", "30", "T4,V100", "GPU-1", "required", "spread")
	f.Add("2", "", "150", ",", "", "strict", "pack")
	f.Add("0", "4Gi", "", "A,a", "GPU-1", "", "")
	f.Add("1e3", "1500m", "-5", "", "", "none", "binpack")
	f.Fuzz(func(t *testing.T, count, mem, cores, models, uuids, topology, placement string) {
		limits := corev1.ResourceList{}
		for name, v := range map[corev1.ResourceName]string{ResourceGPU: count, ResourceGPUMemory: mem, ResourceGPUCores: cores} {
			if q, err := resource.ParseQuantity(v); err == nil {
				limits[name] = q
			}
		}
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Annotations: map[string]string{
				AnnotationModelInclude: models, AnnotationUUIDExclude: uuids,
				AnnotationTopology: topology, AnnotationPlacement: placement,
			}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: limits}}}},
		}
		req, err := PodRequest(p)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("PodRequest() error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, c := range req.Containers {
			if c.Count < 1 || c.Count > MaxDevicesPerContainer || c.ComputePercent < 0 || c.ComputePercent > 100 ||
				c.MemoryMiB < 0 || c.MemoryMiB > MaxSliceMemoryMiB {
				t.Fatalf("PodRequest() accepted out-of-range request %+v", c)
			}
		}
	})
}

// assertStable checks that an encoded payload decodes and re-encodes to the
// same bytes. (Decoding is not the identity on the Go values: "[]" and a
// missing list both mean "none".)
func assertStable(t *testing.T, encoded string, roundTrip func(string) (string, error)) {
	t.Helper()
	again, err := roundTrip(encoded)
	if err != nil {
		t.Fatalf("re-decoding %q failed: %v", encoded, err)
	}
	if again != encoded {
		t.Fatalf("round trip is not stable:\n%s\n%s", encoded, again)
	}
}
