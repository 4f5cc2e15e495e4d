package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		{"no args", "kind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: x\n", "", "no profile with KubeGPU args"},
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
