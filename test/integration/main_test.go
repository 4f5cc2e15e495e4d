// Package integration runs kubegpu's binaries against a real etcd and
// kube-apiserver started on loopback. `make integration` builds everything
// and sets KUBEGPU_BIN_DIR and KUBEGPU_PLUGIN_DIR; without them the tests
// skip.
package integration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubegpu/kubegpu/crishim/advertiser"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

var (
	binDir = os.Getenv("KUBEGPU_BIN_DIR")
	// repoRoot is the checkout, for the shipped configurations.
	repoRoot  = "../.."
	pluginDir = os.Getenv("KUBEGPU_PLUGIN_DIR")
	cluster   *localcluster.Cluster
	// nodeClient writes what a node's kubegpu-crishim writes.
	nodeClient advertiser.Client
	workDir    string
	// signingKey is the scheduler's key; keyFile holds it as PEM.
	signingKey *kubeinterface.Key
	keyFile    string
)

func TestMain(m *testing.M) {
	if binDir == "" || pluginDir == "" {
		fmt.Println("SKIP: integration tests need KUBEGPU_BIN_DIR and KUBEGPU_PLUGIN_DIR (run make integration)")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	workDir, err = os.MkdirTemp("", "kubegpu-integration-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err = localcluster.Start(ctx, localcluster.Options{Dir: workDir, APIServer: filepath.Join(binDir, "kube-apiserver")})
	if err != nil {
		fmt.Println("start cluster:", err)
		return 1
	}
	defer cluster.Stop()
	if nodeClient, err = advertiser.NewClient(cluster.Config); err != nil {
		fmt.Println(err)
		return 1
	}
	if signingKey, keyFile, err = writeSigningKey(workDir); err != nil {
		fmt.Println(err)
		return 1
	}
	code := m.Run()
	if code == 0 && os.Getenv("KUBEGPU_KEEP") == "" {
		cluster.Stop()
		os.RemoveAll(workDir)
	} else {
		fmt.Println("integration: files and logs kept in", workDir)
	}
	return code
}

// writeSigningKey makes an Ed25519 key as `openssl genpkey -algorithm
// ed25519` would and writes it as PKCS #8 PEM.
func writeSigningKey(dir string) (*kubeinterface.Key, string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "allocation-key.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, "", err
	}
	k, err := kubeinterface.LoadKey(path)
	return k, path, err
}
