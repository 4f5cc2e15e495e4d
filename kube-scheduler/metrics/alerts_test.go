package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/internal/alertrules"
)

// TestAlertRulesMatchEmittedLabels: the label values the alert rules match
// on the scheduler's series (reasons, results, inventory states) are
// values the scheduler emits, so that no rule waits for a value that never
// comes.
func TestAlertRulesMatchEmittedLabels(t *testing.T) {
	rules, err := alertrules.ReadFile()
	if err != nil {
		t.Fatal(err)
	}
	emitted := map[string]map[string][]string{
		"kubegpu_scheduler_pending_gpu_pods":           {"reason": reasonNames()},
		"kubegpu_scheduler_rejected_allocations_total": {"reason": rejectReasons},
		"kubegpu_scheduler_allocations_written_total":  {"result": writeResults},
		"kubegpu_scheduler_allocation_records_total":   {"result": recordResults},
		"kubegpu_scheduler_nodes":                      {"inventory": inventoryNames()},
	}
	checked := 0
	for _, r := range rules {
		for _, s := range alertrules.Selectors(r.Expr) {
			if !strings.HasPrefix(s.Metric, "kubegpu_scheduler_") {
				continue
			}
			for _, m := range s.Matchers {
				if m.Label == "job" {
					continue
				}
				values, ok := emitted[s.Metric][m.Label]
				if !ok {
					t.Errorf("%s matches %s on %s: add the values the scheduler emits for it to this test", r.Alert, m.Label, s.Metric)
					continue
				}
				for _, v := range alertrules.LabelValues([]alertrules.Rule{{Expr: s.Text}}, s.Metric, m.Label) {
					checked++
					if !slices.Contains(values, v) {
						t.Errorf("%s matches %s=%q on %s, which the scheduler never emits (it emits %v)", r.Alert, m.Label, v, s.Metric, values)
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("%d label values checked: the rules were not read", checked)
	}
}
