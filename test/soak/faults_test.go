package main

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestPlan: the same seed gives the same schedule, choices included; an
// hour draws every kind three times, five minutes once; every fault
// starts after the warm-up and early enough to end before the run does.
func TestPlan(t *testing.T) {
	for _, tt := range []struct {
		run    time.Duration
		rounds int
	}{{time.Hour, 3}, {30 * time.Minute, 2}, {5 * time.Minute, 1}} {
		a := plan(rand.New(rand.NewPCG(7, 3)), faultKinds, tt.run)
		b := plan(rand.New(rand.NewPCG(7, 3)), faultKinds, tt.run)
		if len(a) != tt.rounds*len(faultKinds) {
			t.Fatalf("%s: %d faults, want %d", tt.run, len(a), tt.rounds*len(faultKinds))
		}
		count := map[string]int{}
		for i := range a {
			if a[i].kind != b[i].kind || a[i].at != b[i].at || a[i].rng.Uint64() != b[i].rng.Uint64() {
				t.Fatalf("%s: fault %d differs between two plans of one seed: %s at %s, %s at %s", tt.run, i, a[i].kind, a[i].at, b[i].kind, b[i].at)
			}
			if a[i].at < warmUp || a[i].at > tt.run-min(3*time.Minute, tt.run/4)+time.Minute {
				t.Errorf("%s: %s starts at %s", tt.run, a[i].kind, a[i].at)
			}
			count[a[i].kind]++
		}
		for _, ft := range faultKinds {
			if count[ft.kind] != tt.rounds {
				t.Errorf("%s: %s drawn %d times, want %d", tt.run, ft.kind, count[ft.kind], tt.rounds)
			}
		}
	}
	if c := plan(rand.New(rand.NewPCG(8, 3)), faultKinds, time.Hour); c[0].kind == plan(rand.New(rand.NewPCG(7, 3)), faultKinds, time.Hour)[0].kind &&
		c[1].kind == plan(rand.New(rand.NewPCG(7, 3)), faultKinds, time.Hour)[1].kind && c[2].at == plan(rand.New(rand.NewPCG(7, 3)), faultKinds, time.Hour)[2].at {
		t.Error("two seeds gave the same schedule")
	}
}
