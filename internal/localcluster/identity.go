package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Users that the components of a cluster run as, as kubeadm sets them up.
const (
	// SchedulerUser is kube-scheduler's user: the bootstrap ClusterRole
	// system:kube-scheduler is bound to it.
	SchedulerUser = "system:kube-scheduler"
	// ControllerManagerUser is kube-controller-manager's user.
	ControllerManagerUser = "system:kube-controller-manager"
	// NodesGroup is the group of every node's identity.
	NodesGroup = "system:nodes"
)

// NodeUser is the user name of node's kubelet credentials, the only identity
// that the Node authorizer and NodeRestriction let change node's objects.
func NodeUser(node string) string { return "system:node:" + node }

// Identity is a user of the cluster with a client certificate from the
// cluster's CA: a component's, a node's or a tenant's credentials. It has
// exactly the permissions RBAC (and, for nodes, the Node authorizer) gives
// its user and groups.
type Identity struct {
	User   string
	Groups []string
	// Kubeconfig is the path of a kubeconfig with the certificate.
	Kubeconfig string
	// Config is the client configuration.
	Config *rest.Config
	// Client is a clientset that acts as the identity.
	Client kubernetes.Interface
}

// Identity returns credentials for user in groups, made on first use and
// written to Dir/identities/.
func (c *Cluster) Identity(user string, groups ...string) (*Identity, error) {
	key := user + "\x00" + strings.Join(groups, ",")
	c.idMu.Lock()
	defer c.idMu.Unlock()
	if id, ok := c.identities[key]; ok {
		return id, nil
	}
	cert, keyPEM, err := c.pki.client(user, groups...)
	if err != nil {
		return nil, fmt.Errorf("localcluster: certificate for %s: %w", user, err)
	}
	dir := filepath.Join(c.opts.Dir, "identities")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, fileName(user)+".kubeconfig")
	if err := writeKubeconfig(path, c.server(), c.pki.caCert, cert, keyPEM, fileName(user)); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	id := &Identity{User: user, Groups: groups, Kubeconfig: path, Config: cfg, Client: client}
	c.identities[key] = id
	return id, nil
}

// NodeIdentity returns kubelet-style credentials of node: user
// system:node:NODE in group system:nodes.
func (c *Cluster) NodeIdentity(node string) (*Identity, error) {
	return c.Identity(NodeUser(node), NodesGroup)
}

// fileName makes a user name safe as a file name.
func fileName(user string) string {
	return strings.NewReplacer(":", "_", "/", "_").Replace(user)
}

func (c *Cluster) server() string { return "https://127.0.0.1:" + strconv.Itoa(c.port) }

// writeKubeconfig writes a kubeconfig for server with a client certificate.
func writeKubeconfig(path, server string, ca, cert, key []byte, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("localcluster: write kubeconfig %s: %w", path, err)
	}
	return nil
}
