package config

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// GroupName is kube-scheduler's configuration group, which plugin args
// share.
const GroupName = "kubescheduler.config.k8s.io"

// SchemeGroupVersion is the internal version of the group.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: runtime.APIVersionInternal}

var (
	// localSchemeBuilder is kube-scheduler's own builder of the group's
	// internal types, so that every scheme the scheduler builds from it
	// (its configuration's, and the one it converts plugin args with)
	// knows KubeGPUArgs.
	localSchemeBuilder = &schedconfig.SchemeBuilder
	// AddToScheme adds the group's internal types to a scheme.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func init() {
	localSchemeBuilder.Register(addKnownTypes)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &KubeGPUArgs{})
	return nil
}
