package kubeinterface

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestCapacityAdd: one rule places each GPU in one count, and models past
// the bound are counted as other.
func TestCapacityAdd(t *testing.T) {
	var c Capacity
	for _, g := range []GPUUse{
		{Healthy: true},
		{Healthy: true, Used: true, Exclusive: true},
		{Healthy: true, Used: true, FreeMiB: 0, FreeMilli: 500},
		{Healthy: true, Used: true, FreeMiB: 1000, FreeMilli: 250},
		{Healthy: false, Used: true},
	} {
		c.Add("T4", "nvidia.com/gpu", g)
	}
	want := ModelCapacity{Model: "T4", Resource: "nvidia.com/gpu", GPUs: 5, Idle: 1, Full: 2, Stranded: 1, Unhealthy: 1, StrandedMiB: 1000}
	if len(c.Models) != 1 || c.Models[0] != want {
		t.Fatalf("models %+v, want %+v", c.Models, want)
	}
	// A node's worst names: many models of 256 characters that JSON
	// would escape, some named "other" with other resources.
	for i := range 2 * MaxCapacityModels {
		c.Add(fmt.Sprintf("%03d%s", i, strings.Repeat("<", 253)), "", GPUUse{Healthy: true})
		c.Add(CapacityOtherModel, fmt.Sprintf("r%d", i), GPUUse{Healthy: true})
	}
	total := c.Total().GPUs
	s, err := EncodeCapacity(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCapacity(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Models) != MaxCapacityModels || got.Total().GPUs != total {
		t.Errorf("%d models, %d GPUs; want %d models, %d GPUs", len(got.Models), got.Total().GPUs, MaxCapacityModels, total)
	}
	// The same GPUs added in another order: the same encoding.
	type gpu struct {
		model, resource string
		use             GPUUse
	}
	var gpus []gpu
	for i := range 3 * MaxCapacityModels {
		gpus = append(gpus, gpu{fmt.Sprintf("m%d", i%(2*MaxCapacityModels)), "", GPUUse{Healthy: true, Used: i%3 == 0, Exclusive: true}})
	}
	var a, b Capacity
	for i := range gpus {
		a.Add(gpus[i].model, gpus[i].resource, gpus[i].use)
		g := gpus[len(gpus)-1-i]
		b.Add(g.model, g.resource, g.use)
	}
	ea, _ := EncodeCapacity(a)
	eb, _ := EncodeCapacity(b)
	if ea != eb {
		t.Error("the encoding depends on the order the GPUs were added in")
	}
}

func TestDecodeCapacityRefuses(t *testing.T) {
	for _, s := range []string{
		``, `[]`, `{"nodes":-1,"models":[]}`, `{"nodes":1,"models":[],"x":1}`, `{"nodes":1} {}`,
		`{"nodes":1,"models":[{"model":"a","gpus":2,"idle":1}]}`,
		`{"nodes":1,"models":[{"model":"a\u001b[31m","gpus":0}]}`,
		`{"nodes":1,"models":[{"model":"a","gpus":-1,"idle":-1}]}`,
		`{"nodes":1,"models":[` + strings.Repeat(`{"model":"a","gpus":0},`, MaxCapacityModels) + `{"model":"a","gpus":0}]}`,
		strings.Repeat(" ", MaxCapacityBytes+1),
	} {
		if _, err := DecodeCapacity(s); !errors.Is(err, ErrInvalidCapacity) {
			t.Errorf("DecodeCapacity(%.60q) = %v, want ErrInvalidCapacity", s, err)
		}
	}
}

func FuzzDecodeCapacity(f *testing.F) {
	var c Capacity
	c.Add("Tesla T4", "nvidia.com/gpu", GPUUse{Healthy: true, Used: true, FreeMiB: 10, FreeMilli: 10})
	good, err := EncodeCapacity(c)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(`{"nodes":0,"models":null}`)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := DecodeCapacity(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidCapacity) {
				t.Fatalf("error %v does not wrap ErrInvalidCapacity", err)
			}
			return
		}
		again, err := EncodeCapacity(c)
		if err != nil {
			t.Fatalf("a decoded capacity does not encode: %v", err)
		}
		if _, err := DecodeCapacity(again); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	})
}
