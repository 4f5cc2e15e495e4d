// Package scheme registers the KubeGPU plugin's args (package config and
// its v1) into kube-scheduler's configuration scheme when it is imported,
// and decodes a KubeSchedulerConfiguration with that scheme, as the
// scheduler does.
package scheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	configv1 "github.com/kubegpu/kubegpu/kube-scheduler/apis/config/v1"
)

func init() {
	AddToScheme(schedscheme.Scheme)
}

// AddToScheme adds the args' internal and v1 types, defaults and
// conversions to a scheme (with kube-scheduler's own, which share their
// builders).
func AddToScheme(scheme *runtime.Scheme) {
	utilruntime.Must(config.AddToScheme(scheme))
	utilruntime.Must(configv1.AddToScheme(scheme))
}

// Decode decodes a KubeSchedulerConfiguration as kube-scheduler decodes
// its --config file: strictly, defaulted, converted to the internal types,
// the KubeGPU args included.
func Decode(data []byte) (*schedconfig.KubeSchedulerConfiguration, error) {
	obj, gvk, err := schedscheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	cfg, ok := obj.(*schedconfig.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("got %s, want KubeSchedulerConfiguration", gvk)
	}
	return cfg, nil
}
