package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestServeStopsWithMetrics: the shim serves CRI and metrics, and returns
// promptly when its context ends (a metrics server left running would keep
// it from stopping). A metrics address that is taken does not stop CRI.
func TestServeStopsWithMetrics(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, kubeinterface.EncodeHMACSecret([]byte(strings.Repeat("k", 32))), 0o600); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	for _, tt := range []struct {
		name, addr  string
		wantMetrics bool
		// brokenModule puts a .so that does not load in the plugin
		// directory: /healthz says so, CRI is served.
		brokenModule bool
	}{
		{name: "metrics", addr: freeAddr, wantMetrics: true},
		{name: "metrics port taken", addr: taken.Addr().String()},
		{name: "module fails to load", addr: freeAddr, wantMetrics: true, brokenModule: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "crishim.sock")
			pluginDir := t.TempDir()
			if tt.brokenModule {
				if err := os.WriteFile(filepath.Join(pluginDir, "nvidia.so"), []byte("\x7fELF truncated"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			o := &serveOptions{pluginOptions: pluginOptions{PluginDir: pluginDir, NodeName: "n1"},
				Listen: sock, RuntimeEndpoint: "unix://" + filepath.Join(dir, "none.sock"), AllocationKey: key,
				Interval: time.Hour, MetricsAddress: tt.addr}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- o.run(ctx) }()
			deadline := time.Now().Add(10 * time.Second)
			for {
				if _, err := os.Stat(sock); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no CRI socket after 10 s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tt.wantMetrics {
				resp, err := http.Get("http://" + tt.addr + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(string(body), "kubegpu_crishim_connections ") {
					t.Errorf("metrics:\n%s", body)
				}
				if failed := strings.Contains(string(body), `kubegpu_crishim_modules_failed{module="nvidia.so"} 1`); failed != tt.brokenModule {
					t.Errorf("metrics say the module failed: %v, want %v:\n%s", failed, tt.brokenModule, body)
				}
				resp, err = http.Get("http://" + tt.addr + "/healthz")
				if err != nil {
					t.Fatal(err)
				}
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				wantCode, want := http.StatusOK, "ok"
				if tt.brokenModule {
					wantCode, want = http.StatusServiceUnavailable, "nvidia.so: load device plugin: plugin "+filepath.Join(pluginDir, "nvidia.so")+": not a kubegpu device module"
				}
				if resp.StatusCode != wantCode || !strings.Contains(string(body), want) {
					t.Errorf("/healthz: %d %q, want %d and %q", resp.StatusCode, body, wantCode, want)
				}
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("run did not return 10 s after its context ended")
			}
		})
	}
}

// TestShimRefusesReadableHMACSecret: a shared HMAC secret others can read
// lets them mint allocations: the shim does not start with one.
func TestShimRefusesReadableHMACSecret(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, kubeinterface.EncodeHMACSecret([]byte(strings.Repeat("k", 32))), 0o644); err != nil {
		t.Fatal(err)
	}
	o := &serveOptions{pluginOptions: pluginOptions{PluginDir: t.TempDir(), NodeName: "n1"},
		Listen: filepath.Join(dir, "crishim.sock"), RuntimeEndpoint: "unix://" + filepath.Join(dir, "none.sock"), AllocationKey: key, Interval: time.Hour}
	if err := o.run(context.Background()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("shim with a world-readable HMAC secret: %v", err)
	}
}
