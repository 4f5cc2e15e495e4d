package proxy

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkVersion compares a small call through the proxy with the same
// call made to the runtime directly (an in-process fake: the difference is
// the proxy's own cost).
func BenchmarkVersion(b *testing.B) {
	dir := b.TempDir()
	backend := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(backend, &fakeRuntime{})
	bl, err := net.Listen("unix", filepath.Join(dir, "runtime.sock"))
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = backend.Serve(bl) }()
	defer backend.Stop()
	p, err := New(Options{Backend: "unix://" + filepath.Join(dir, "runtime.sock")})
	if err != nil {
		b.Fatal(err)
	}
	l, err := Listen(filepath.Join(dir, "crishim.sock"))
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = p.Serve(l) }()
	defer p.Stop(0)
	for _, target := range []string{"direct", "proxy"} {
		sock := map[string]string{"direct": "runtime.sock", "proxy": "crishim.sock"}[target]
		b.Run("to="+target, func(b *testing.B) {
			conn, err := grpc.NewClient("unix://"+filepath.Join(dir, sock), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			rt := runtimeapi.NewRuntimeServiceClient(conn)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
