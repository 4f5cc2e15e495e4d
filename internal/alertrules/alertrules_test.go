package alertrules

import (
	"reflect"
	"strings"
	"testing"
)

func TestSelectors(t *testing.T) {
	expr := `max by (reason) (increase(kubegpu_scheduler_rejected_allocations_total{job="kubegpu-scheduler", reason=~"a|b"}[10m])) > 0
	  or kubegpu_x > 1 or absent(up{job="kubegpu-scheduler"} == 1) or kubegpu_y{reason!="c"}`
	got := Selectors(expr)
	if len(got) != 4 || got[0].Metric != "kubegpu_scheduler_rejected_allocations_total" || !got[0].HasJob() ||
		got[1].Text != "kubegpu_x" || got[1].HasJob() || got[2].Metric != "up" || !got[2].HasJob() || got[3].HasJob() {
		t.Fatalf("Selectors = %+v", got)
	}
	if u := Unscoped(expr); !reflect.DeepEqual(u, []string{"kubegpu_x", `kubegpu_y{reason!="c"}`}) {
		t.Errorf("Unscoped = %q", u)
	}
	rules := []Rule{{Expr: expr}, {Expr: `kubegpu_y{job="j", reason="d"}`}}
	if v := LabelValues(rules, "kubegpu_y", "reason"); !reflect.DeepEqual(v, []string{"c", "d"}) {
		t.Errorf("LabelValues(kubegpu_y) = %q", v)
	}
	if v := LabelValues(rules, "kubegpu_scheduler_rejected_allocations_total", "reason"); !reflect.DeepEqual(v, []string{"a", "b"}) {
		t.Errorf("LabelValues(rejected) = %q", v)
	}
}

// TestEverySelectorNamesItsJob: each series the alert rules read is
// selected with its job, so that a tenant's pod exporting series of
// kubegpu's names neither fires nor hides an alert.
func TestEverySelectorNamesItsJob(t *testing.T) {
	rules, err := ReadFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 10 {
		t.Fatalf("%d rules read from %s", len(rules), FileName)
	}
	for _, r := range rules {
		if len(Selectors(r.Expr)) == 0 {
			t.Errorf("%s: no selector of kubegpu's series read from %q", r.Alert, r.Expr)
		}
		for _, s := range Unscoped(r.Expr) {
			t.Errorf("%s: %s selects no job", r.Alert, s)
		}
		if strings.Contains(r.Expr, "{}") {
			t.Errorf("%s: empty selector in %q", r.Alert, r.Expr)
		}
	}
}
