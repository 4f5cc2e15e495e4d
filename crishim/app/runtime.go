package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runtimeClient is the shim's own CRI client of the runtime, for the
// device ledger.
type runtimeClient struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
}

// dialRuntime makes a client of the runtime's CRI endpoint; it connects
// on first use and reconnects by itself.
func dialRuntime(endpoint string) (*runtimeClient, error) {
	if !strings.HasPrefix(endpoint, "unix://") {
		return nil, fmt.Errorf("container runtime endpoint %q: want unix:///absolute/path/to/the.sock", endpoint)
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("container runtime endpoint %q: %w", endpoint, err)
	}
	return &runtimeClient{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// ListContainers lists the runtime's containers that match filter.
func (c *runtimeClient) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	resp, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: filter})
	if err != nil {
		return nil, err
	}
	return resp.GetContainers(), nil
}

// LivePods returns the UIDs of the pods with a ready sandbox.
func (c *runtimeClient) LivePods(ctx context.Context) (map[string]bool, error) {
	sandboxes, err := c.ReadySandboxes(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, sb := range sandboxes {
		live[sb.GetMetadata().GetUid()] = true
	}
	return live, nil
}

// CDIOff reports whether the runtime says it ignores CDI devices: the
// verbose status of containerd carries its CRI config, with enableCDI in
// 1.7 (2.x injects CDI devices whatever it says). A runtime that does not
// say (CRI-O, containerd 2.x without the key) is taken to inject them.
func (c *runtimeClient) CDIOff(ctx context.Context) (bool, error) {
	resp, err := c.rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return false, err
	}
	raw, ok := resp.GetInfo()["config"]
	if !ok {
		return false, nil
	}
	var cfg struct {
		EnableCDI *bool `json:"enableCDI"`
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return false, nil
	}
	return cfg.EnableCDI != nil && !*cfg.EnableCDI, nil
}

// RunningContainers lists the running containers.
func (c *runtimeClient) RunningContainers(ctx context.Context) ([]*runtimeapi.Container, error) {
	return c.ListContainers(ctx, &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
}

// ReadySandboxes lists the ready pod sandboxes, with their annotations.
func (c *runtimeClient) ReadySandboxes(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	resp, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return nil, err
	}
	return resp.GetItems(), nil
}

// StopContainer stops a container, killing it after a second.
func (c *runtimeClient) StopContainer(ctx context.Context, id string) error {
	_, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 1})
	return err
}

func (c *runtimeClient) Close() error { return c.conn.Close() }
