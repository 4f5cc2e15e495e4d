package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	devicescheduler "github.com/kubegpu/kubegpu/device-scheduler"
	"github.com/kubegpu/kubegpu/types"
)

// maxConfigBytes bounds a scheduler configuration file read by ArgsFromFile.
const maxConfigBytes = 1 << 20

// DefaultArgs are the plugin's arguments when a configuration gives none
// but its signing key.
func DefaultArgs() *Args {
	a := &Args{}
	setDefaults(a)
	return a
}

// ArgsFromFile reads the plugin's arguments from a KubeSchedulerConfiguration
// file, as kubegpu-scheduler would: those of profile (or, if empty, of the
// first profile that configures the plugin), decoded strictly, defaulted and
// validated. Tools that must judge as the scheduler does (kubegpu explain)
// read the scheduler's own file with it.
func ArgsFromFile(path, profile string) (*Args, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scheduler configuration: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("scheduler configuration: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("scheduler configuration %s: over %d bytes", path, maxConfigBytes)
	}
	var config struct {
		Kind     string `json:"kind"`
		Profiles []struct {
			SchedulerName string `json:"schedulerName"`
			PluginConfig  []struct {
				Name string          `json:"name"`
				Args json.RawMessage `json:"args"`
			} `json:"pluginConfig"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal(data, &config); err != nil {
		return nil, fmt.Errorf("scheduler configuration %s: %w", path, err)
	}
	if config.Kind != "KubeSchedulerConfiguration" {
		return nil, fmt.Errorf("scheduler configuration %s: kind %q, want KubeSchedulerConfiguration", path, config.Kind)
	}
	for _, p := range config.Profiles {
		if profile != "" && p.SchedulerName != profile {
			continue
		}
		for _, pc := range p.PluginConfig {
			if pc.Name != Name {
				continue
			}
			args, err := decodeArgs(&runtime.Unknown{Raw: pc.Args, ContentType: runtime.ContentTypeJSON})
			if err != nil {
				return nil, fmt.Errorf("scheduler configuration %s, profile %q: %w", path, p.SchedulerName, err)
			}
			return args, nil
		}
	}
	if profile != "" {
		return nil, fmt.Errorf("scheduler configuration %s: no profile %q with %s args", path, profile, Name)
	}
	return nil, fmt.Errorf("scheduler configuration %s: no profile with %s args", path, Name)
}

// EngineConfig is the allocation engine the plugin runs with these
// arguments, over the scheduler sides of the device modules given.
func (a *Args) EngineConfig(plugins []types.SchedulerPlugin) devicescheduler.Config {
	return devicescheduler.Config{
		Plugins:         plugins,
		Policy:          a.NodePolicy,
		DevicePolicy:    a.DevicePolicy,
		DefaultTopology: a.DefaultTopology,
		Learn:           a.learnConfig(),
	}
}
