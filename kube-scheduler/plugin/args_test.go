package plugin

import (
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"

	"k8s.io/apimachinery/pkg/runtime"
)

func TestDecodeArgs(t *testing.T) {
	for _, tt := range []struct {
		name, raw, wantErr string
		check              func(t *testing.T, a *Args)
	}{
		{name: "defaults", raw: `{"signingKeyFile":"/k"}`, check: func(t *testing.T, a *Args) {
			if a.PluginDir != config.DefaultPluginDir || a.NodePolicy != "kubegpu" || a.DefaultTopology != "preferred" || a.HeartbeatStaleness.Duration != 40*time.Second || a.PodsWithoutDevices != "Score" || a.GPUMetrics != "PerGPU" {
				t.Errorf("defaults not applied: %+v", a)
			}
		}},
		{name: "everything", raw: `{"signingKeyFile":"/k","pluginDir":"/p","pluginOptions":["simgpu.preset=dgx1"],"nodePolicy":"spread","devicePolicy":"binpack","defaultTopology":"required","heartbeatStaleness":"1m","podsWithoutDevices":"Ignore"}`,
			check: func(t *testing.T, a *Args) {
				if a.NodePolicy != "spread" || a.DevicePolicy != "binpack" || a.DefaultTopology != "required" || a.HeartbeatStaleness.Duration != time.Minute || a.PodsWithoutDevices != "Ignore" {
					t.Errorf("args not read: %+v", a)
				}
			}},
		{name: "typo", raw: `{"signingKeyFile":"/k","nodePolicey":"spread"}`, wantErr: `unknown field "nodePolicey"`},
		{name: "no key", raw: `{}`, wantErr: "signingKeyFile: Required value"},
		{name: "bad policy", raw: `{"signingKeyFile":"/k","nodePolicy":"tetris"}`, wantErr: `nodePolicy: Unsupported value: "tetris"`},
		{name: "bad device policy", raw: `{"signingKeyFile":"/k","nodePolicy":"spread","devicePolicy":"kubegpu"}`, wantErr: `devicePolicy: Unsupported value: "kubegpu"`},
		{name: "bad topology", raw: `{"signingKeyFile":"/k","defaultTopology":"strict"}`, wantErr: `defaultTopology: Unsupported value: "strict"`},
		{name: "bad pods without devices", raw: `{"signingKeyFile":"/k","podsWithoutDevices":"score"}`, wantErr: `podsWithoutDevices: Unsupported value: "score"`},
		{name: "bad GPU metrics", raw: `{"signingKeyFile":"/k","gpuMetrics":"none"}`, wantErr: `gpuMetrics: Unsupported value: "none"`},
		{name: "short staleness", raw: `{"signingKeyFile":"/k","heartbeatStaleness":"10ms"}`, wantErr: "must be at least 1s"},
		{name: "bad option", raw: `{"signingKeyFile":"/k","pluginOptions":["preset=dgx1"]}`, wantErr: "pluginOptions"},
		{name: "not an object", raw: `[1]`, wantErr: "decode KubeGPU args"},
		{name: "learned mix", raw: `{"signingKeyFile":"/k","workloadHalfLife":"168h","workloadMaxTypes":1024}`, check: func(t *testing.T, a *Args) {
			if c := a.LearnConfig(); c.HalfLife != 168*time.Hour || c.MaxTypes != 1024 {
				t.Errorf("learned mix args not read: %+v", c)
			}
		}},
		{name: "short half-life", raw: `{"signingKeyFile":"/k","workloadHalfLife":"1s"}`, wantErr: "workloadHalfLife"},
		{name: "long half-life", raw: `{"signingKeyFile":"/k","workloadHalfLife":"100000h"}`, wantErr: "workloadHalfLife"},
		{name: "too many types", raw: `{"signingKeyFile":"/k","workloadMaxTypes":100000}`, wantErr: "workloadMaxTypes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, err := decodeArgs(&runtime.Unknown{Raw: []byte(tt.raw), ContentType: runtime.ContentTypeJSON})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("decodeArgs() = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, a)
		})
	}
}

func FuzzDecodeArgs(f *testing.F) {
	f.Add(`{"signingKeyFile":"/k","heartbeatStaleness":"1m"}`)
	f.Add(`{"nodePolicy":"binpack"}`)
	f.Fuzz(func(t *testing.T, raw string) {
		a, err := decodeArgs(&runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON})
		if err == nil && (a.SigningKeyFile == "" || a.HeartbeatStaleness == nil) {
			t.Fatalf("accepted args without a key or defaults: %+v", a)
		}
	})
}
