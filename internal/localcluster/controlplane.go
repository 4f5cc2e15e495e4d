package localcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Pod Security admission's cluster-wide defaults: every namespace but
// kube-system enforces the baseline profile, as a multi-tenant cluster
// would; a namespace may ask for more with its own labels.
const admissionConfig = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
      audit: restricted
      audit-version: latest
      warn: baseline
      warn-version: latest
    exemptions:
      usernames: []
      runtimeClasses: []
      namespaces: [kube-system]
`

func (c *Cluster) admissionConfigFile() string {
	return filepath.Join(c.opts.Dir, "admission-config.yaml")
}

func (c *Cluster) writeAdmissionConfig() error {
	return os.WriteFile(c.admissionConfigFile(), []byte(admissionConfig), 0o600)
}

// startControllerManager runs kube-controller-manager as its own user with
// a ServiceAccount per controller, as kubeadm does, and waits for its
// /healthz. It signs ServiceAccount tokens' root CA and CSRs with the
// cluster's CA.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	if c.opts.ControllerManager == "" {
		return nil
	}
	id, err := c.Identity(ControllerManagerUser)
	if err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	c.kcm, err = StartProcess(filepath.Join(c.opts.Dir, "kube-controller-manager.log"), c.opts.ControllerManager,
		"--kubeconfig="+id.Kubeconfig,
		"--authentication-kubeconfig="+id.Kubeconfig, "--authorization-kubeconfig="+id.Kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--cert-dir="+filepath.Join(c.opts.Dir, "kcm-certs"),
		"--leader-elect=false",
		"--controllers="+c.opts.Controllers,
		// As on kube-apiserver (PodGroups served): the PodGroup protection
		// controller removes the finalizer admission puts on each group,
		// without which no deleted PodGroup would go.
		"--feature-gates=GenericWorkload=true",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.pki.saKeyFile,
		"--root-ca-file="+c.pki.caFile,
		"--cluster-signing-cert-file="+c.pki.caFile, "--cluster-signing-key-file="+c.pki.caKeyFile,
		// New nodes lose their not-ready taint within two seconds of
		// reporting Ready (the default period is five).
		"--node-monitor-period=2s",
		"--kube-api-qps=100", "--kube-api-burst=200",
		"--v=1")
	if err != nil {
		return fmt.Errorf("localcluster: start kube-controller-manager: %w", err)
	}
	return c.kcm.WaitFor(ctx, 90*time.Second, healthz(port))
}

// healthz checks the /healthz of a component serving HTTPS on a loopback
// port with a self-signed certificate.
func healthz(port int) func(context.Context) error {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback health check of a self-signed server
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz: %s", resp.Status)
		}
		return nil
	}
}

// ControllerManagerLog is the path of kube-controller-manager's log.
func (c *Cluster) ControllerManagerLog() string {
	return filepath.Join(c.opts.Dir, "kube-controller-manager.log")
}
