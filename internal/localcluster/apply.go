package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// installManager is the field manager of what Apply installs.
const installManager = "kubegpu-install"

// Apply installs the objects of the YAML manifests at paths as cluster-admin,
// with server-side apply (as `kubectl apply --server-side` does): the
// shipped RBAC, admission policies and bindings. It is the only thing the
// tests and the demo do as cluster-admin, besides creating namespaces and
// cleaning up.
func (c *Cluster) Apply(ctx context.Context, paths ...string) error {
	return c.eachObject(paths, func(r dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		_, err := r.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: installManager, Force: true})
		return err
	})
}

// Delete removes the objects of the YAML manifests at paths, as Apply's
// undo; objects already gone are fine.
func (c *Cluster) Delete(ctx context.Context, paths ...string) error {
	return c.eachObject(paths, func(r dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
		err := r.Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

func (c *Cluster) eachObject(paths []string, f func(dynamic.ResourceInterface, *unstructured.Unstructured) error) error {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	for _, path := range paths {
		objs, err := ReadManifest(path)
		if err != nil {
			return err
		}
		for i, obj := range objs {
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				return fmt.Errorf("%s: object %d (%s %s): %w", path, i+1, gvk.Kind, obj.GetName(), err)
			}
			var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				if obj.GetNamespace() == "" {
					obj.SetNamespace(metav1.NamespaceDefault)
				}
				r = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			if err := f(r, obj); err != nil {
				return fmt.Errorf("%s: %s %s: %w", path, gvk.Kind, obj.GetName(), err)
			}
		}
	}
	return nil
}

// ReadManifest reads the objects of a multi-document YAML file.
func ReadManifest(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, len(out)+1, err)
		}
		if len(obj) == 0 {
			continue // an empty document
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d has no apiVersion, kind or name", path, len(out)+1)
		}
		out = append(out, u)
	}
}
