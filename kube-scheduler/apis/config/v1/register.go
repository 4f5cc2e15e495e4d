package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
)

// GroupName is kube-scheduler's configuration group, which plugin args
// share.
const GroupName = "kubescheduler.config.k8s.io"

// SchemeGroupVersion is the version the args are written in.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1"}

var (
	// localSchemeBuilder is kube-scheduler's own builder of the group's v1
	// types (see package config); the generated conversions register
	// themselves with it.
	localSchemeBuilder = &schedconfigv1.SchemeBuilder
	// AddToScheme adds the v1 types, their defaults and conversions to a
	// scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func init() {
	localSchemeBuilder.Register(addKnownTypes)
	localSchemeBuilder.Register(RegisterDefaults)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &KubeGPUArgs{})
	return nil
}
