package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/internal/alertrules"
)

// TestAlertRulesMatchEmittedReasons: the reasons the alert rules match on
// the shim's refusals are Reasons the shim emits.
func TestAlertRulesMatchEmittedReasons(t *testing.T) {
	rules, err := alertrules.ReadFile()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, r := range rules {
		for _, s := range alertrules.Selectors(r.Expr) {
			if !strings.HasPrefix(s.Metric, "kubegpu_crishim_") {
				continue
			}
			for _, m := range s.Matchers {
				switch {
				case m.Label == "job":
				case s.Metric == "kubegpu_crishim_create_container_refusals_total" && m.Label == "reason":
					for _, v := range alertrules.LabelValues([]alertrules.Rule{{Expr: s.Text}}, s.Metric, m.Label) {
						checked++
						if !slices.Contains(Reasons, Reason(v)) {
							t.Errorf("%s matches reason %q, which the shim never emits (Reasons: %v)", r.Alert, v, Reasons)
						}
					}
				default:
					t.Errorf("%s matches %s on %s: check its values against what the shim emits in this test", r.Alert, m.Label, s.Metric)
				}
			}
		}
	}
	if checked < 3 {
		t.Errorf("%d reasons checked: the rules were not read", checked)
	}
}
