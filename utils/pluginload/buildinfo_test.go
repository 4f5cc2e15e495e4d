package pluginload

import (
	"reflect"
	"runtime/debug"
	"testing"
)

func info(goVersion string, mods []*debug.Module, kv ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{GoVersion: goVersion, Main: debug.Module{Path: "github.com/kubegpu/kubegpu", Version: "(devel)"}, Deps: mods}
	for i := 0; i+1 < len(kv); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
	}
	return bi
}

func mod(path, version, sum string) *debug.Module {
	return &debug.Module{Path: path, Version: version, Sum: sum}
}

func TestDiffBuildInfo(t *testing.T) {
	api := mod("k8s.io/api", "v0.36.3", "h1:a=")
	klog := mod("k8s.io/klog/v2", "v2.140.0", "h1:k=")
	host := info("go1.26.8", []*debug.Module{api, klog}, "-trimpath", "true", "CGO_ENABLED", "1", "-buildmode", "exe", "-ldflags", "-X v=1")

	tests := []struct {
		name string
		plug *debug.BuildInfo
		want []string
	}{
		{
			name: "same build, other buildmode and ldflags, fewer deps",
			plug: info("go1.26.8", []*debug.Module{klog}, "-trimpath", "true", "CGO_ENABLED", "1", "-buildmode", "plugin"),
		},
		{
			name: "plugin-only dependency is fine",
			plug: info("go1.26.8", []*debug.Module{klog, mod("github.com/NVIDIA/go-nvml", "v0.13.0-1", "h1:n=")}, "-trimpath", "true", "CGO_ENABLED", "1"),
		},
		{
			name: "toolchain",
			plug: info("go1.26.7", []*debug.Module{klog}, "-trimpath", "true", "CGO_ENABLED", "1"),
			want: []string{"Go toolchain: host go1.26.8, plugin go1.26.7"},
		},
		{
			name: "settings",
			plug: info("go1.26.8", nil, "CGO_ENABLED", "0", "-race", "true"),
			want: []string{
				"build setting -race: host (unset), plugin true",
				"build setting -trimpath: host true, plugin (unset)",
				"build setting CGO_ENABLED: host 1, plugin 0",
			},
		},
		{
			name: "dependency version and replacement",
			plug: info("go1.26.8", []*debug.Module{
				mod("k8s.io/api", "v0.35.0", "h1:b="),
				{Path: "k8s.io/klog/v2", Version: "v2.140.0", Sum: "h1:k=", Replace: &debug.Module{Path: "k8s.io/klog/v2", Version: "v2.130.0", Sum: "h1:r="}},
			}, "-trimpath", "true", "CGO_ENABLED", "1"),
			want: []string{
				"module k8s.io/api: host v0.36.3 h1:a=, plugin v0.35.0 h1:b=",
				"module k8s.io/klog/v2: host v2.140.0 h1:k=, plugin v2.140.0 h1:k= => k8s.io/klog/v2 v2.130.0 h1:r=",
			},
		},
		{
			// An out-of-tree module requiring kubegpu through a local
			// replace: nothing to compare; the runtime checks the packages.
			name: "local replacement left to the runtime",
			plug: info("go1.26.8", []*debug.Module{
				{Path: "k8s.io/klog/v2", Version: "v0.0.0-00010101000000-000000000000", Replace: &debug.Module{Path: "../klog"}},
			}, "-trimpath", "true", "CGO_ENABLED", "1"),
		},
		{
			name: "clean trees at other revisions",
			plug: info("go1.26.8", nil, "-trimpath", "true", "CGO_ENABLED", "1", "vcs.revision", "bbb", "vcs.modified", "false"),
			want: []string{"source revision of github.com/kubegpu/kubegpu: host aaa (modified=false), plugin bbb (modified=false)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := host
			if tt.name == "clean trees at other revisions" {
				h = info("go1.26.8", nil, "-trimpath", "true", "CGO_ENABLED", "1", "vcs.revision", "aaa", "vcs.modified", "false")
			}
			if got := diffBuildInfo(h, tt.plug); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("diffBuildInfo() =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestDiffBuildInfoThirdPartyModule(t *testing.T) {
	// A module built outside this repository depends on kubegpu by version.
	host := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/kubegpu/kubegpu", Version: "v0.2.0"}}
	plug := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/acme-npu"},
		Deps: []*debug.Module{mod("github.com/kubegpu/kubegpu", "v0.1.0", "h1:x=")}}
	want := []string{"module github.com/kubegpu/kubegpu: host v0.2.0, plugin v0.1.0 h1:x="}
	if got := diffBuildInfo(host, plug); !reflect.DeepEqual(got, want) {
		t.Errorf("diffBuildInfo() = %q, want %q", got, want)
	}
}
