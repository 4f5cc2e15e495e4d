// Package integration runs kubegpu's binaries against a real etcd,
// kube-apiserver and kube-controller-manager started on loopback and
// configured as a production control plane (Node and RBAC authorization,
// NodeRestriction and the default admission plugins, Pod Security
// admission), with kubegpu's shipped RBAC and admission policies installed.
// Every component runs with the identity it has in production: the
// scheduler as system:kube-scheduler, nodes (kubelet, kubegpu-crishim and
// the simulated kubelets of nodes without one) with node credentials, the
// CLI as a user bound only to the shipped read-only role, and tenants as
// namespaced users with the built-in edit role. cluster-admin only installs
// and cleans up. `make integration` builds everything and sets
// KUBEGPU_BIN_DIR and KUBEGPU_PLUGIN_DIR; without them the tests skip.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

var (
	binDir = os.Getenv("KUBEGPU_BIN_DIR")
	// repoRoot is the checkout, for the shipped configurations.
	repoRoot  = "../.."
	pluginDir = os.Getenv("KUBEGPU_PLUGIN_DIR")
	cluster   *localcluster.Cluster
	// viewer is the kubegpu CLI's identity, bound to the shipped role
	// kubegpu-viewer only; the tests read the cluster through it too.
	viewer *localcluster.Identity
	// scheduler is kubegpu-scheduler's identity (system:kube-scheduler).
	schedulerID *localcluster.Identity
	workDir     string
	// signingKey is the scheduler's key; keyFile holds it as PEM and
	// pubFile its public half, which nodes hold.
	signingKey       *kubeinterface.Key
	keyFile, pubFile string
)

// shipped are the manifests the tests install, as an operator would.
var shipped = []string{
	"kube-scheduler/deploy/rbac.yaml",
	"kube-scheduler/deploy/capacity.yaml",
	"cli/deploy/rbac.yaml",
	"deploy/admission/kubegpu-policies.yaml",
	"deploy/dra/kubegpu-deviceclass.yaml",
}

// viewerUser is bound to kubegpu-viewer when the cluster is installed.
const viewerUser = "gpu-viewer"

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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, err = localcluster.Start(ctx, localcluster.Options{Dir: workDir,
		APIServer: filepath.Join(binDir, "kube-apiserver"), ControllerManager: filepath.Join(binDir, "kube-controller-manager")})
	if err != nil {
		fmt.Println("start cluster:", err)
		return 1
	}
	defer cluster.Stop()
	if err := install(ctx); err != nil {
		fmt.Println("install kubegpu:", err)
		return 1
	}
	if signingKey, keyFile, pubFile, err = writeKeys(workDir); err != nil {
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

// install applies the shipped manifests and binds the CLI's role, as
// cluster-admin, and makes the identities the tests use.
func install(ctx context.Context) error {
	var paths []string
	for _, p := range shipped {
		paths = append(paths, filepath.Join(repoRoot, p))
	}
	if err := cluster.Apply(ctx, paths...); err != nil {
		return err
	}
	// The API server takes a moment to load new admission policies.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return policiesInForce(ctx), nil
	}); err != nil {
		return fmt.Errorf("kubegpu's admission policies not in force: %w", err)
	}
	_, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubegpu-viewer-" + viewerUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubegpu-viewer"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: viewerUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if viewer, err = cluster.Identity(viewerUser); err != nil {
		return err
	}
	schedulerID, err = cluster.Identity(localcluster.SchedulerUser)
	return err
}

// writeKeys makes an Ed25519 key in dir (keyfiles.WriteEd25519) and
// returns it with the paths of the private and the public key files.
func writeKeys(dir string) (*kubeinterface.Key, string, string, error) {
	private, public, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return nil, "", "", err
	}
	k, err := kubeinterface.LoadSigningKey(private)
	return k, private, public, err
}
