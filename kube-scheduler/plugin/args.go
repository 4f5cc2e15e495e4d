package plugin

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config"
	_ "github.com/kubegpu/kubegpu/kube-scheduler/apis/config/scheme" // registers the args into the scheduler's scheme
	configv1 "github.com/kubegpu/kubegpu/kube-scheduler/apis/config/v1"
	"github.com/kubegpu/kubegpu/kube-scheduler/apis/config/validation"
)

// Args are the plugin's arguments: KubeGPUArgs of package config
// (kube-scheduler/apis/config), which kube-scheduler decodes from a
// profile's pluginConfig strictly, defaults and converts before New sees
// them.
type Args = config.KubeGPUArgs

// decodeArgs takes the plugin's args as the scheduler hands them (decoded
// and defaulted already) and validates them. Args handed otherwise (nil,
// raw as runtime.Unknown, or typed but not defaulted, by embedders and
// tests) are decoded with the scheduler's scheme and defaulted as its
// configuration file's are.
func decodeArgs(obj runtime.Object) (*Args, error) {
	var args *Args
	switch o := obj.(type) {
	case nil:
		args = DefaultArgs()
	case *Args:
		args = withDefaults(o)
	case *runtime.Unknown:
		gvk := configv1.SchemeGroupVersion.WithKind("KubeGPUArgs")
		decoded, _, err := schedscheme.Codecs.UniversalDecoder().Decode(o.Raw, &gvk, nil)
		if err != nil {
			return nil, fmt.Errorf("decode %s args: %w", Name, err)
		}
		if args, _ = decoded.(*Args); args == nil {
			return nil, fmt.Errorf("decode %s args: got %T", Name, decoded)
		}
	default:
		return nil, fmt.Errorf("decode %s args: want %s args, got %T", Name, Name, obj)
	}
	if errs := validation.ValidateKubeGPUArgs(field.NewPath("pluginConfig").Key(Name).Child("args"), args); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s args: %w", Name, errs.ToAggregate())
	}
	return args, nil
}

// DefaultArgs are the plugin's arguments when a configuration gives none
// but its signing key: the v1 defaults.
func DefaultArgs() *Args { return withDefaults(&Args{}) }

// withDefaults is a copy of a with the v1 defaults where it leaves fields
// out.
func withDefaults(a *Args) *Args {
	v := &configv1.KubeGPUArgs{}
	out := &Args{}
	// The generated conversions of two types of one shape: they cannot fail.
	if err := configv1.Convert_config_KubeGPUArgs_To_v1_KubeGPUArgs(a.DeepCopy(), v, nil); err != nil {
		panic(fmt.Sprintf("%s args: %v", Name, err))
	}
	configv1.SetObjectDefaults_KubeGPUArgs(v)
	if err := configv1.Convert_v1_KubeGPUArgs_To_config_KubeGPUArgs(v, out, nil); err != nil {
		panic(fmt.Sprintf("%s args: %v", Name, err))
	}
	return out
}
