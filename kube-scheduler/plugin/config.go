package plugin

import (
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config/scheme"
)

// maxConfigBytes bounds a scheduler configuration file read by ArgsFromFile.
const maxConfigBytes = 1 << 20

// ArgsFromFile reads the plugin's arguments from a KubeSchedulerConfiguration
// file as kubegpu-scheduler does, through kube-scheduler's scheme: those of
// profile (or, if empty, of the first profile that configures the plugin),
// decoded strictly, defaulted and validated. Tools that must judge as the
// scheduler does (kubegpu explain) read the scheduler's own file with it.
func ArgsFromFile(path, profile string) (*Args, error) {
	args, _, err := ReadSchedulerConfig(path, profile)
	return args, err
}

// ReadSchedulerConfig is ArgsFromFile, with the scheduler names of all the
// file's profiles: the pods the scheduler places (`kubegpu explain` counts
// the pods nominated by any of them, as the scheduler does).
func ReadSchedulerConfig(path, profile string) (*Args, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("scheduler configuration: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("scheduler configuration: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, nil, fmt.Errorf("scheduler configuration %s: over %d bytes", path, maxConfigBytes)
	}
	var head struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return nil, nil, fmt.Errorf("scheduler configuration %s: %w", path, err)
	}
	if head.Kind != "KubeSchedulerConfiguration" {
		return nil, nil, fmt.Errorf("scheduler configuration %s: kind %q, want KubeSchedulerConfiguration", path, head.Kind)
	}
	cfg, err := scheme.Decode(data)
	if err != nil {
		return nil, nil, fmt.Errorf("scheduler configuration %s: %w", path, err)
	}
	names := make([]string, 0, len(cfg.Profiles))
	for _, p := range cfg.Profiles {
		names = append(names, p.SchedulerName)
	}
	for _, p := range cfg.Profiles {
		if profile != "" && p.SchedulerName != profile {
			continue
		}
		for _, pc := range p.PluginConfig {
			if pc.Name != Name {
				continue
			}
			args, err := decodeArgs(pc.Args)
			if err != nil {
				return nil, nil, fmt.Errorf("scheduler configuration %s, profile %q: %w", path, p.SchedulerName, err)
			}
			return args, names, nil
		}
	}
	if profile != "" {
		return nil, nil, fmt.Errorf("scheduler configuration %s: no profile %q with %s args", path, profile, Name)
	}
	return nil, nil, fmt.Errorf("scheduler configuration %s: no profile with %s args", path, Name)
}
