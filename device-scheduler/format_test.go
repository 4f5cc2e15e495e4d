package devicescheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

func TestPercent(t *testing.T) {
	for milli, want := range map[int]string{0: "0%", 250: "25%", 1000: "100%", 125: "12.5%", 5: "0.5%", -5: "-0.5%", -250: "-25%"} {
		if got := Percent(milli); got != want {
			t.Errorf("Percent(%d) = %q, want %q", milli, got, want)
		}
	}
}

// TestRefusalDetails: a refusal's details speak in the units users write
// (per cent of compute) and, when no device matches the pod's model
// selectors, name the models the node has.
func TestRefusalDetails(t *testing.T) {
	e := newEngine(t, "")
	n := simNode(t, e, "t4x4")
	var p Placement
	r := request(t, e, types.ContainerRequest{Name: "c", Count: 1, Selector: types.Selector{IncludeModels: []string{"T4"}}})
	var nf *NotFitError
	if err := e.Evaluate(n, r, &p); !errors.As(err, &nf) || nf.Reason != ReasonSelectors || !strings.Contains(nf.Detail(), `(the node's models: "Tesla T4")`) {
		t.Errorf("model not on the node: %v, want %q naming the node's models", err, ReasonSelectors)
	}
	for i := range 4 {
		place(t, e, n, string(rune('a'+i)), request(t, e, slice(90, 1000)))
	}
	if err := e.Evaluate(n, request(t, e, slice(25, 1000)), &p); !errors.As(err, &nf) || !strings.Contains(nf.Detail(), "with 25% compute") || strings.Contains(nf.Detail(), "‰") {
		t.Errorf("slice over the free compute: %v, want the share in per cent", err)
	}
}
