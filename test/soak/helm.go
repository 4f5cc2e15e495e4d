package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The chart's release. The replicas under test are processes, each behind
// a proxy of its own, which the chart's Deployment cannot give them: its
// pods get a node selector no node has, and stay pending. What the
// release owns in the cluster — kubegpu's RBAC, admission policies,
// viewer and metrics roles, the capacity ConfigMap — is what it installs
// over the shipped manifests (--take-ownership, as an operator moving to
// the chart does) and what each `helm upgrade` applies again under load.
const (
	chartRelease   = "kg"
	chartNamespace = "kube-system"
)

// helm runs the pinned helm as cluster-admin, with its caches in the work
// directory.
func (s *soak) helm(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.o.nodeBinDir, "helm"), append(args, "--kubeconfig", s.cluster.Kubeconfig)...)
	home := filepath.Join(s.dir, "helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// chartValues are the release's values; verbosity changes with each
// upgrade, so that every upgrade rolls the Deployment too.
func chartValues(verbosity int) []string {
	return []string{"--namespace", chartNamespace, "--set", "mode=only", "--set", "replicaCount=2",
		"--set", "nodeSelector.node-role\\.kubernetes\\.io/control-plane=null",
		"--set-string", "nodeSelector.soak\\.kubegpu\\.io/no-such-node=true",
		"--set", fmt.Sprintf("logVerbosity=%d", verbosity)}
}

// installChart installs the chart over the shipped manifests.
func (s *soak) installChart(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.o.nodeBinDir, "helm")); err != nil {
		return fmt.Errorf("helm: %w (make soak installs it with hack/tools.sh helm)", err)
	}
	key, err := os.ReadFile(s.keys.gen(0).private)
	if err != nil {
		return err
	}
	// The chart never makes the signing key's Secret.
	if _, err := s.cluster.Client.CoreV1().Secrets(chartNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "kubegpu-allocation-key"},
		Data:       map[string][]byte{"allocation-key.pem": key},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	chart := filepath.Join(repoRoot(), "deploy", "helm", "kubegpu")
	_, err = s.helm(ctx, append([]string{"install", chartRelease, chart, "--take-ownership"}, chartValues(2)...)...)
	return err
}

// helmUpgrade upgrades the release with another log verbosity.
func (f *faults) helmUpgrade(ctx context.Context, _ *rand.Rand) error {
	f.mu.Lock()
	n := f.injected["helm-upgrade"]
	f.mu.Unlock()
	chart := filepath.Join(repoRoot(), "deploy", "helm", "kubegpu")
	_, err := f.s.helm(ctx, append([]string{"upgrade", chartRelease, chart}, chartValues(3-n%2)...)...)
	return err
}
