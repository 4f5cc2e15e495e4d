package kubeinterface

import (
	"errors"
	"testing"
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

func FuzzDecodeHeld(f *testing.F) {
	f.Add(`[{"id":"gpu0","uuid":"GPU-1","exclusive":true,"memoryMiB":16384,"computePercent":100}]`)
	f.Add(`[{"id":"gpu1","uuid":"GPU-2","memoryMiB":4096,"computePercent":25}]`)
	f.Add(`[{"id":"gpu1","uuid":"GPU-2","memoryMiB":0,"computePercent":60,"claim":"6f1c2d3e-0000-4000-8000-000000000001","request":"gpus"}]`)
	f.Add(`[{"id":"","memoryMiB":-1}]`)
	f.Add(`{}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, value string) {
		held, err := DecodeHeld(value)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeHeld() error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := EncodeHeld(held)
		if err != nil {
			t.Fatalf("decoded held devices do not encode: %v", err)
		}
		assertStable(t, again, func(s string) (string, error) {
			held, err := DecodeHeld(s)
			if err != nil {
				return "", err
			}
			return EncodeHeld(held)
		})
	})
}
