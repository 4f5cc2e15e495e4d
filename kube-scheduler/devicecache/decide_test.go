package devicecache

import (
	"errors"
	"fmt"
	"testing"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
)

// TestRefusalClassified: an engine refusal, classified when the memo took
// it in or met unclassified (preemption's dry run), gives Filter the
// status, pending reason and wait for freed devices it stands for, and
// explain its details.
func TestRefusalClassified(t *testing.T) {
	notFree := &devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}
	for _, tc := range []struct {
		name         string
		err          error
		unresolvable bool
		msg          string
		reason       Reason
		waits        bool
	}{
		{"not enough free", notFree, false, "GPUs: " + devicescheduler.ReasonNotEnoughFree, ReasonNotEnoughFree, true},
		{"never fits", errors.Join(errNeverFits, &devicescheduler.NotFitError{Reason: devicescheduler.ReasonUnhealthy}),
			true, "GPUs: " + devicescheduler.ReasonUnhealthy + neverFitsSuffix, ReasonUnhealthy, false},
		{"topology", &devicescheduler.NotFitError{Reason: devicescheduler.ReasonTopology}, false, "GPUs: " + devicescheduler.ReasonTopology, ReasonTopology, true},
		{"not an engine's", errors.New("something else"), false, "GPUs: something else", ReasonOther, false},
		{"wrapped not-fit", fmt.Errorf("wrapped: %w", notFree), false, "GPUs: " + devicescheduler.ReasonNotEnoughFree, ReasonNotEnoughFree, true},
		{"no inventory", ErrNoInventory, true, "GPUs: " + ErrNoInventory.Error(), ReasonNoInventory, false},
		{"key refused", fmt.Errorf("%w (x)", ErrKeyRefused), true, "GPUs: " + ErrKeyRefused.Error() + " (x)", ReasonNoInventory, false},
		{"not live", errNoLease, false, "GPUs: " + notLiveReason(errNoLease), ReasonNodeNotLive, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Classify(tc.err)
			if !errors.Is(r, tc.err) || r.Error() != tc.err.Error() {
				t.Errorf("classified %v wraps %v, says %q", tc.err, r.Unwrap(), r.Error())
			}
			for _, err := range []error{r, tc.err} {
				got := Classify(err)
				if got.Unresolvable != tc.unresolvable || got.Message != tc.msg || got.Waits != tc.waits || got.Reason != tc.reason {
					t.Errorf("%T: %+v; want unresolvable %v %q, waits %v, reason %s", err, got, tc.unresolvable, tc.msg, tc.waits, tc.reason)
				}
				if ReasonOf(err) != tc.reason {
					t.Errorf("%T: ReasonOf %s, want %s", err, ReasonOf(err), tc.reason)
				}
			}
		})
	}
}

// TestMostHopeful: of a node's refusals of a pod's variants, a wait for
// freed devices comes first, then what evictions could end, then the first.
func TestMostHopeful(t *testing.T) {
	never := errors.Join(errNeverFits, &devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree})
	notFree := &devicescheduler.NotFitError{Reason: devicescheduler.ReasonNotEnoughFree}
	other := errors.New("the allocator refused")
	for _, tc := range []struct {
		name     string
		refusals []error
		want     int
	}{
		{"one", []error{never}, 0},
		{"never, then a wait", []error{never, other, notFree}, 2},
		{"never, then resolvable", []error{never, ErrNoInventory, other}, 2},
		{"all unresolvable", []error{never, ErrNoInventory}, 0},
		{"the first wait", []error{notFree, notFree}, 0},
	} {
		if got := MostHopeful(tc.refusals); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
