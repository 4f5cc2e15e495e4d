package advertiser

import (
	"context"
	"encoding/json"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// Client is what the advertiser reads and writes in the API: its Node and
// its heartbeat Lease. NewClient implements it with REST clients for those
// two resources only: a clientset (or the core API types) would link every
// API group into kubegpu-crishim, which runs on every node, and keep it in
// memory there.
type Client interface {
	// NodeMeta returns the named Node's metadata.
	NodeMeta(ctx context.Context, name string) (*metav1.ObjectMeta, error)
	// PatchNode applies a JSON merge patch to the named Node, or to its
	// subresource (such as "status") when one is given.
	PatchNode(ctx context.Context, name string, patch []byte, subresource ...string) error
	// GetLease returns the named Lease.
	GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error)
	// CreateLease creates a Lease.
	CreateLease(ctx context.Context, lease *coordinationv1.Lease) error
	// UpdateLease replaces a Lease (optimistic concurrency on its
	// resourceVersion).
	UpdateLease(ctx context.Context, lease *coordinationv1.Lease) error
}

// coreV1 is the core API group's version; the package k8s.io/api/core/v1
// is not imported (see Client).
var coreV1 = schema.GroupVersion{Version: "v1"}

type restClient struct {
	core, coordination *rest.RESTClient
}

// NewClient returns a Client that talks to the API server of cfg.
func NewClient(cfg *rest.Config) (Client, error) {
	// Only the kinds read and written: registering whole API groups
	// would keep all their code in the binary.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, coreV1)
	scheme.AddKnownTypes(coordinationv1.SchemeGroupVersion, &coordinationv1.Lease{})
	metav1.AddToGroupVersion(scheme, coordinationv1.SchemeGroupVersion)
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	client := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.APIPath = apiPath
		c.GroupVersion = &gv
		c.NegotiatedSerializer = codecs
		// JSON only: the codecs have no CBOR, whatever client-go's
		// feature gates prefer.
		c.ContentType = runtime.ContentTypeJSON
		c.AcceptContentTypes = runtime.ContentTypeJSON
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientFor(c)
		if err != nil {
			return nil, fmt.Errorf("client for %s: %w", gv, err)
		}
		return rc, nil
	}
	core, err := client("/api", coreV1)
	if err != nil {
		return nil, err
	}
	coordination, err := client("/apis", coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &restClient{core: core, coordination: coordination}, nil
}

func (c *restClient) NodeMeta(ctx context.Context, name string) (*metav1.ObjectMeta, error) {
	res := c.core.Get().Resource("nodes").Name(name).Do(ctx)
	if err := res.Error(); err != nil {
		return nil, err // decoded: the API server's own message
	}
	body, err := res.Raw()
	if err != nil {
		return nil, err
	}
	var n struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("decode node %s: %w", name, err)
	}
	return &n.Metadata, nil
}

func (c *restClient) PatchNode(ctx context.Context, name string, patch []byte, subresource ...string) error {
	return c.core.Patch(ktypes.MergePatchType).Resource("nodes").Name(name).SubResource(subresource...).Body(patch).Do(ctx).Error()
}

func (c *restClient) GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	return l, c.coordination.Get().Namespace(namespace).Resource("leases").Name(name).Do(ctx).Into(l)
}

func (c *restClient) CreateLease(ctx context.Context, lease *coordinationv1.Lease) error {
	return c.coordination.Post().Namespace(lease.Namespace).Resource("leases").Body(lease).Do(ctx).Error()
}

func (c *restClient) UpdateLease(ctx context.Context, lease *coordinationv1.Lease) error {
	return c.coordination.Put().Namespace(lease.Namespace).Resource("leases").Name(lease.Name).Body(lease).Do(ctx).Error()
}
