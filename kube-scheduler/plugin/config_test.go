package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestArgsFromShippedFiles: the shipped configurations read as the
// scheduler reads them; bad files get errors that say what is wrong.
func TestArgsFromShippedFiles(t *testing.T) {
	for _, name := range []string{"kubegpu-scheduler.yaml", "second-scheduler.yaml"} {
		a, err := ArgsFromFile(filepath.Join("..", "config", name), "")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if a.NodePolicy != "kubegpu" || a.HeartbeatStaleness.Duration != 40*time.Second || a.WorkloadHalfLife.Duration != 24*time.Hour {
			t.Errorf("%s: args %+v, want the shipped policy, heartbeatStaleness and the defaults", name, a)
		}
	}
	dir := t.TempDir()
	write := func(content string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: gpu\n  pluginConfig:\n  - name: KubeGPU\n    args:\n      signingKeyFile: /k\n"
	for _, tt := range []struct {
		name, content, profile, wantErr string
	}{
		{"good", head + "      devicePolicy: spread\n", "gpu", ""},
		{"unknown field", head + "      nodePolicyy: spread\n", "", `unknown field "nodePolicyy"`},
		{"bad value", head + "      workloadMaxTypes: 5\n", "", "workloadMaxTypes"},
		{"no such profile", head, "other", `no profile "other"`},
		{"not a configuration", "kind: Pod\n", "", "want KubeSchedulerConfiguration"},
		{"no args", "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: x\n", "", "no profile with KubeGPU args"},
		{"no apiVersion", "kind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: x\n", "", "apiVersion"},
		{"too large", "kind: KubeSchedulerConfiguration\n#" + strings.Repeat("x", maxConfigBytes), "", "over"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ArgsFromFile(write(tt.content), tt.profile)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("ArgsFromFile() = %v", err)
			case tt.wantErr == "" && a.DevicePolicy != "spread":
				t.Errorf("devicePolicy = %q, want spread", a.DevicePolicy)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("ArgsFromFile() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestOldConfigsDecodeAlike: the configurations kubegpu has shipped (the
// example files, the Helm chart's rendered ones) and one with every field
// decode through kube-scheduler's scheme to the args the hand-written
// decoder of earlier versions read from them (decoded.golden.json, written
// by that decoder).
func TestOldConfigsDecodeAlike(t *testing.T) {
	dir := filepath.Join("testdata", "args")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("configurations in %s: %v %v", dir, files, err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "decoded.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, f := range files {
		a, err := ArgsFromFile(f, "")
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		a.TypeMeta = metav1.TypeMeta{}
		got[filepath.Base(f)] = a
	}
	var wantArgs, gotArgs any
	gotJSON, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &wantArgs); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(gotJSON, &gotArgs); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotArgs, wantArgs) {
		t.Errorf("decoded args differ from the earlier decoder's:\ngot  %s\nwant %s", gotJSON, want)
	}
}

// TestArgsDecodedStrictly: what kube-scheduler's scheme refuses in the
// args, which the earlier hand-written decoder let through: keys in
// another case (encoding/json matched them regardless of case), an
// apiVersion or kind inside the args that is not KubeGPUArgs'. And a
// profile that enables KubeGPU without args gets the defaults, so its
// missing signing key is named.
func TestArgsDecodedStrictly(t *testing.T) {
	dir := t.TempDir()
	const head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: gpu\n  plugins:\n    multiPoint:\n      enabled:\n      - name: KubeGPU\n"
	const args = "  pluginConfig:\n  - name: KubeGPU\n    args:\n      signingKeyFile: /k\n"
	for _, tt := range []struct{ name, content, wantErr string }{
		{"key in another case", head + args + "      recordQps: 5\n", `unknown field "recordQps"`},
		{"other kind in args", head + args + "      kind: CoschedulingArgs\n", `no kind "CoschedulingArgs"`},
		{"enabled without args", head, "signingKeyFile: Required value"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := ArgsFromFile(p, ""); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ArgsFromFile() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestReadSchedulerConfigNames: the scheduler names of every profile,
// whichever profile's args are read; a single profile without a name is
// kube-scheduler's default-scheduler.
func TestReadSchedulerConfigNames(t *testing.T) {
	const args = "  pluginConfig:\n  - name: KubeGPU\n    args:\n      signingKeyFile: /k\n"
	const head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n"
	for _, tt := range []struct {
		name, content, profile string
		want                   []string
	}{
		{"two profiles", head + "- schedulerName: gpu\n" + args + "- schedulerName: gpu-batch\n" + args + "      devicePolicy: spread\n", "gpu-batch", []string{"gpu", "gpu-batch"}},
		{"one without a name", head + "-" + args[1:] + "      devicePolicy: spread\n", "", []string{"default-scheduler"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			a, names, err := ReadSchedulerConfig(p, tt.profile)
			if err != nil {
				t.Fatal(err)
			}
			if a.DevicePolicy != "spread" {
				t.Errorf("devicePolicy = %q: not the profile's args", a.DevicePolicy)
			}
			if !reflect.DeepEqual(names, tt.want) {
				t.Errorf("scheduler names %q, want %q", names, tt.want)
			}
		})
	}
}
