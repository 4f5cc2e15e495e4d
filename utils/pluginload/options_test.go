package pluginload

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseOptions(t *testing.T) {
	got, err := ParseOptions([]string{"simgpu.preset=dgx1", "simgpu.unhealthy=2,5", "nvidia.mode=cdi", "simgpu.empty="})
	if err != nil {
		t.Fatal(err)
	}
	want := Options{"simgpu": {"preset": "dgx1", "unhealthy": "2,5", "empty": ""}, "nvidia": {"mode": "cdi"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseOptions() = %v, want %v", got, want)
	}
	for _, bad := range []string{"preset=dgx1", "simgpu.preset", ".x=1", "simgpu.=1"} {
		if _, err := ParseOptions([]string{bad}); err == nil || !strings.Contains(err.Error(), "MODULE.KEY=VALUE") {
			t.Errorf("ParseOptions(%q) error = %v", bad, err)
		}
	}
	if _, err := ParseOptions([]string{"a.b=1", "a.b=2"}); err == nil || !strings.Contains(err.Error(), "set twice") {
		t.Errorf("duplicate option error = %v", err)
	}
}

func TestCheckModules(t *testing.T) {
	opts := Options{"simgpuu": {"preset": "dgx1"}}
	err := opts.CheckModules(nil)
	if err == nil || !strings.Contains(err.Error(), `module "simgpuu", which is not loaded (loaded: none)`) {
		t.Errorf("CheckModules() error = %v", err)
	}
}
