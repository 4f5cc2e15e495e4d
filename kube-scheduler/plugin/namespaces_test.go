package plugin

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// anyNamespace is a NamespaceLister in which every namespace exists,
// with the labels of labeled (if named there) or none.
type anyNamespace struct {
	labeled map[string]map[string]string
}

var _ corelisters.NamespaceLister = anyNamespace{}

func (a anyNamespace) List(labels.Selector) ([]*corev1.Namespace, error) { return nil, nil }

func (a anyNamespace) Get(name string) (*corev1.Namespace, error) {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: a.labeled[name]}}, nil
}
