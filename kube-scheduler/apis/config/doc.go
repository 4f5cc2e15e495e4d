// +k8s:deepcopy-gen=package
// +groupName=kubescheduler.config.k8s.io

// Package config is the internal type of the KubeGPU plugin's args
// (KubeGPUArgs), registered into kube-scheduler's own scheme beside the
// upstream plugins' args, as out-of-tree plugins do: the scheduler decodes
// a profile's `pluginConfig: [{name: KubeGPU, args: ...}]` strictly from
// its versioned form (package v1), defaults it and converts it to this
// type before the plugin sees it. Package validation checks it; package
// scheme registers it.
package config
