package advertiser

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// Client is what the advertiser reads and writes in the API: its own Node,
// nothing else. With the node's own credentials (kubelet's kubeconfig) the
// Node authorizer and NodeRestriction let it change no other object.
// NewClient implements it with a REST client for Nodes only. (The
// ResourceSlice publisher, Slices, uses upstream's controller and so a
// clientset.)
type Client interface {
	// GetNode returns what the advertiser owns on the named Node.
	GetNode(ctx context.Context, name string) (*Node, error)
	// PatchNode applies a patch of type pt (a JSON merge patch, or a
	// strategic merge patch for the Node's conditions, which merges them by
	// type) to the named Node, or to its subresource (such as "status")
	// when one is given.
	PatchNode(ctx context.Context, name string, pt ktypes.PatchType, patch []byte, subresource ...string) error
}

// Node is what the advertiser owns on a Node object: the inventory
// annotation, the extended resources' capacity and allocatable, and the
// conditions kubeinterface.ConditionDevicesReady and ConditionDRAConflict.
type Node struct {
	UID ktypes.UID
	// Inventory is the kubegpu.io/inventory annotation; HasInventory is
	// false without one.
	Inventory    string
	HasInventory bool
	// Capacity and Allocatable hold the extended resources kubegpu
	// publishes, as the Node's status has them.
	Capacity, Allocatable ResourceList
	// DevicesReady is the Node's kubeinterface.ConditionDevicesReady
	// condition, DRAConflict its kubeinterface.ConditionDRAConflict; nil
	// without one.
	DevicesReady, DRAConflict *Condition
}

// Condition is a Node condition as the advertiser writes it: the time
// fields are set when it is written.
type Condition struct {
	// Status is "True" or "False".
	Status string
	// Reason is one CamelCase word, e.g. kubeinterface.ReasonModuleLoadFailed.
	Reason string
	// Message says what is wrong, for people.
	Message string
}

// coreV1 is the core API group's version; the package k8s.io/api/core/v1
// is not imported (see Client).
var coreV1 = schema.GroupVersion{Version: "v1"}

type restClient struct {
	core *rest.RESTClient
}

// NewClient returns a Client that talks to the API server of cfg.
func NewClient(cfg *rest.Config) (Client, error) {
	// Only the kinds read and written: registering whole API groups
	// would keep all their code in the binary.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, coreV1)
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &coreV1
	c.NegotiatedSerializer = codecs
	// JSON only: the codecs have no CBOR, whatever client-go's feature
	// gates prefer.
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	core, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", coreV1, err)
	}
	return &restClient{core: core}, nil
}

// GetNode reads the Node from the API server's watch cache
// (resourceVersion=0), as kubelet reads its own Node: cheap, and at worst a
// moment behind, which the next round corrects.
func (c *restClient) GetNode(ctx context.Context, name string) (*Node, error) {
	res := c.core.Get().Resource("nodes").Name(name).Param("resourceVersion", "0").Do(ctx)
	if err := res.Error(); err != nil {
		return nil, err // decoded: the API server's own message
	}
	body, err := res.Raw()
	if err != nil {
		return nil, err
	}
	return decodeNode(body)
}

// decodeNode reads what the advertiser owns from a Node's JSON.
func decodeNode(body []byte) (*Node, error) {
	var n struct {
		Metadata struct {
			UID         ktypes.UID        `json:"uid"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Status struct {
			Capacity    map[string]resource.Quantity `json:"capacity"`
			Allocatable map[string]resource.Quantity `json:"allocatable"`
			Conditions  []struct {
				Type    string `json:"type"`
				Status  string `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("decode node: %w", err)
	}
	out := &Node{UID: n.Metadata.UID, Capacity: ResourceList{}, Allocatable: ResourceList{}}
	out.Inventory, out.HasInventory = n.Metadata.Annotations[kubeinterface.AnnotationInventory]
	for _, name := range resourceNames {
		if q, ok := n.Status.Capacity[name]; ok {
			out.Capacity[name] = q
		}
		if q, ok := n.Status.Allocatable[name]; ok {
			out.Allocatable[name] = q
		}
	}
	for _, c := range n.Status.Conditions {
		switch c.Type {
		case kubeinterface.ConditionDevicesReady:
			out.DevicesReady = &Condition{Status: c.Status, Reason: c.Reason, Message: c.Message}
		case kubeinterface.ConditionDRAConflict:
			out.DRAConflict = &Condition{Status: c.Status, Reason: c.Reason, Message: c.Message}
		}
	}
	return out, nil
}

// PatchPodStatus applies a strategic merge patch to a pod's status: the
// node's credentials may, for pods bound to it.
func (c *restClient) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	return c.core.Patch(ktypes.StrategicMergePatchType).Namespace(namespace).Resource("pods").Name(name).SubResource("status").Body(patch).Do(ctx).Error()
}

// CreateEvent creates a core/v1 Event in namespace.
func (c *restClient) CreateEvent(ctx context.Context, namespace string, event []byte) error {
	return c.core.Post().Namespace(namespace).Resource("events").Body(event).Do(ctx).Error()
}

func (c *restClient) PatchNode(ctx context.Context, name string, pt ktypes.PatchType, patch []byte, subresource ...string) error {
	return c.core.Patch(pt).Resource("nodes").Name(name).SubResource(subresource...).Body(patch).Do(ctx).Error()
}
