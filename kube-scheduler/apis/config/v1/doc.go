// +k8s:deepcopy-gen=package
// +k8s:conversion-gen=github.com/kubegpu/kubegpu/kube-scheduler/apis/config
// +k8s:defaulter-gen=TypeMeta
// +k8s:defaulter-gen-input=github.com/kubegpu/kubegpu/kube-scheduler/apis/config/v1
// +groupName=kubescheduler.config.k8s.io

// Package v1 is the versioned form of the KubeGPU plugin's args, as they
// are written in a KubeSchedulerConfiguration of
// kubescheduler.config.k8s.io/v1: decoded strictly (an unknown field is an
// error), defaulted (defaults.go) and converted to the internal type.
// Deep copy, conversion and defaulting functions are generated
// (`make generate`).
package v1
