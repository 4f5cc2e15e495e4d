package draclaims

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// maxPodResourcesMessage bounds kubelet's answer, as kubelet's own client
// for the API does (16 MiB).
const maxPodResourcesMessage = 16 << 20

// Kubelet asks kubelet's PodResources API (v1) on a unix socket.
type Kubelet struct {
	conn   *grpc.ClientConn
	client podresourcesapi.PodResourcesListerClient
}

// DialKubelet returns a client of kubelet's PodResources API at endpoint
// ("unix:///var/lib/kubelet/pod-resources/kubelet.sock"); it connects at
// the first call.
func DialKubelet(endpoint string) (*Kubelet, error) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResourcesMessage)))
	if err != nil {
		return nil, fmt.Errorf("kubelet's PodResources API at %s: %w", endpoint, err)
	}
	return &Kubelet{conn: conn, client: podresourcesapi.NewPodResourcesListerClient(conn)}, nil
}

// List lists the resources of the node's pods.
func (k *Kubelet) List(ctx context.Context) ([]*podresourcesapi.PodResources, error) {
	resp, err := k.client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetPodResources(), nil
}

// Close closes the connection.
func (k *Kubelet) Close() error { return k.conn.Close() }
