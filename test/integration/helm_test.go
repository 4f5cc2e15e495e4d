package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kubegpu/kubegpu/internal/alertrules"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
)

// imageDir holds make image's archives and their references.
var imageDir = func() string {
	if d := os.Getenv("KUBEGPU_IMAGE_DIR"); d != "" {
		return d
	}
	return filepath.Join(repoRoot, "_output", "images")
}()

// helm runs the pinned helm (hack/tools.sh helm) as cluster-admin, who
// installs.
func helm(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(nodeBinDir, "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm: %v (make integration installs it with hack/tools.sh helm)", err)
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", cluster.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(workDir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(workDir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(workDir, "helm", "data"))
	// Only stdout is the output; the chart gives helm nothing to warn of
	// (it warned of every symbolic link in a chart).
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	if strings.Contains(stderr.String(), "WARNING") || strings.Contains(stderr.String(), "symbolic link") {
		t.Errorf("helm %s warned:\n%s", strings.Join(args, " "), stderr.String())
	}
	return out.String()
}

// imageRef is the reference make image built name under (NAME.ref:
// "REF@DIGEST"), without the digest.
func imageRef(t *testing.T, name string) (repo, tag string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(imageDir, name+".ref"))
	if err != nil {
		t.Fatalf("%v (run make image)", err)
	}
	ref, _, _ := strings.Cut(strings.TrimSpace(string(b)), "@")
	i := strings.LastIndexByte(ref, ':')
	return ref[:i], ref[i+1:]
}

// TestHelmChart: the chart, installed with helm into kube-system, runs
// kubegpu-scheduler from its image (imported into the real node's
// containerd) as a Deployment on the real node, through kubegpu-crishim;
// it schedules GPU pods addressed to it onto the real node, where the
// container gets its GPUs, and onto a simulated node. `helm upgrade` to a
// changed configuration rolls the scheduler, which keeps scheduling;
// `helm uninstall` leaves none of the objects it made behind.
//
// The scheduler runs on the host's network, as control-plane components
// do, with the API server's address given (apiServer.host/port): the test
// cluster has no kube-proxy, so the kubernetes Service is not reachable
// from pods.
func TestHelmChart(t *testing.T) {
	ctx := context.Background()
	repo, tag := imageRef(t, "kubegpu-scheduler")
	chart := filepath.Join(repoRoot, "deploy", "helm", "kubegpu")
	helm(ctx, t, "lint", chart)

	// The test cluster runs kubegpu's policies and viewer role, applied
	// with kubectl as an operator applies them: the chart installs over
	// them and adopts them (--take-ownership), and its uninstall keeps
	// them in force. What it adds in mode second, the policy that refuses
	// GPU pods for other schedulers, is kept too: the operator removes it
	// at the end, as the chart's README says, since the other tests'
	// pods use the default scheduler.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, "kubegpu-scheduler-name", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, "kubegpu-scheduler-name", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})

	// The real node, and a simulated one.
	n := startNode(ctx, t)
	const nodeName = "helm-node"
	nodeID, err := cluster.NodeIdentity(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	// GPU 3 unhealthy, for the metric that reports it.
	shimMetrics := freeAddress(t)
	_, sock := startShim(ctx, t, n, nodeName, "--plugin-option=simgpu.preset=t4x4", "--plugin-option=simgpu.unhealthy=3",
		"--kubeconfig="+nodeID.Kubeconfig, "--interval=1s", "--metrics-bind-address="+shimMetrics)
	startKubelet(ctx, t, n, nodeName, sock, 0)
	for _, image := range []string{"kubegpu-scheduler.tar", "kubegpu.tar"} {
		if err := n.ImportImage(ctx, filepath.Join(imageDir, image)); err != nil {
			t.Fatal(err)
		}
	}
	addNodes(ctx, t, "helm-sim", "dgx1", 1)
	// The cluster's own scheduler places the chart's pods; the chart's
	// serves GPU pods named to it.
	startScheduler(ctx, t)

	// The signing key, from the documented command's output; the chart
	// never makes it.
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM, err := os.ReadFile(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "kubegpu-allocation-key"},
		Data:       map[string][]byte{"allocation-key.pem": keyPEM},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Secrets("kube-system").Delete(context.Background(), "kubegpu-allocation-key", metav1.DeleteOptions{})
	})
	api, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(freeAddress(t), ":")
	pubValues := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(pubValues, []byte("nodesPublicKey: |\n  "+strings.ReplaceAll(strings.TrimSpace(string(pubPEM)), "\n", "\n  ")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{chart, "--namespace", "kube-system", "-f", pubValues,
		"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "replicaCount=1", "--set", "hostNetwork=true", "--set", "securePort=" + port,
		"--set", "apiServer.host=" + api.Hostname(), "--set", "apiServer.port=" + api.Port(),
		// The real node plays the node trusted as the control plane that
		// the replicas (which hold the signing key) must run on: the
		// chart's default selector, control-plane nodes, is replaced by it.
		"--set", "nodeSelector.node-role\\.kubernetes\\.io/control-plane=null",
		"--set", "nodeSelector.kubernetes\\.io/hostname=" + nodeName,
		"--wait", "--timeout", "3m"}
	installed := false
	uninstall := func() {
		if installed {
			installed = false
			helm(context.Background(), t, "uninstall", "kg", "--namespace", "kube-system", "--wait", "--timeout", "2m")
		}
	}
	t.Cleanup(uninstall)
	// A node selector no node matches: the install's notes say so (and
	// --wait would fail it).
	notes := helm(ctx, t, append([]string{"install", "kg", "--dry-run=server", "--take-ownership"},
		append(slices.Clone(common), "--set", "nodeSelector.kubernetes\\.io/hostname=no-such-node")...)...)
	if !strings.Contains(notes, "WARNING: no node has the labels of nodeSelector") {
		t.Errorf("the notes of an install whose replicas no node can take:\n%s", notes)
	}
	out := helm(ctx, t, append([]string{"install", "kg", "--take-ownership"}, common...)...)
	installed = true
	t.Log(out)
	if strings.Contains(out, "WARNING") {
		t.Errorf("the notes warn of an install that schedules:\n%s", out)
	}
	manifest := helm(ctx, t, "get", "manifest", "kg", "--namespace", "kube-system")

	ns := namespace(ctx, t, "helm")
	gpuPodOn := func(name, node string) *corev1.Pod {
		p := gpuPod(name, 1, 0, 0, nil)
		p.Spec.SchedulerName = "kubegpu-scheduler"
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].Image = busyboxImage
		p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
		p.Spec.Containers[0].Command = []string{"env"}
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
		return p
	}
	// The API server takes in each of the chart's policies on its own: a
	// GPU pod is admitted only once the mutating one is in force too.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, gpuPodOn("probe", nodeName), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	}); err != nil {
		t.Fatal("the chart's admission policies did not admit a GPU pod:", err)
	}
	runsWithGPU := func(name string) {
		t.Helper()
		createPods(ctx, t, ns, gpuPodOn(name, nodeName))
		var got *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err = cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && got.Status.Phase == corev1.PodSucceeded, nil
		}); err != nil {
			t.Fatalf("pod %s did not succeed: %v; status %+v\n%s", name, err, got.Status, schedulerPodLogs(ctx, t))
		}
		a, err := objects.PodAllocation(got)
		if err != nil || len(a.Containers) != 1 || len(a.Containers[0].Devices) != 1 {
			t.Fatalf("pod %s: allocation %+v, %v", name, a, err)
		}
		ids, err := crictl(ctx, n, sock, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name="+name)
		if err != nil || ids == "" {
			t.Fatalf("find the container: %v %q", err, ids)
		}
		logs, err := crictl(ctx, n, sock, "logs", strings.Fields(ids)[0])
		if err != nil {
			t.Fatal(err)
		}
		if want := "NVIDIA_VISIBLE_DEVICES=" + a.Containers[0].Devices[0].UUID; !strings.Contains(logs, want) {
			t.Errorf("container of %s printed:\n%s\nwant %s", name, logs, want)
		}
	}
	runsWithGPU("on-real-node")
	// The CLI's image runs too (no shell, non-root).
	cliRepo, cliTag := imageRef(t, "kubegpu")
	cli := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cli"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, NodeSelector: map[string]string{"kubernetes.io/hostname": nodeName},
		Containers: []corev1.Container{{Name: "kubegpu", Image: cliRepo + ":" + cliTag, ImagePullPolicy: corev1.PullNever, Args: []string{"version"}}}}}
	createPods(ctx, t, ns, cli)
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "cli", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodSucceeded, nil
	}); err != nil {
		t.Errorf("the CLI image did not run: %v", err)
	} else if logs, err := cluster.Client.CoreV1().Pods(ns).GetLogs("cli", &corev1.PodLogOptions{}).DoRaw(ctx); err != nil || !strings.Contains(string(logs), "kubegpu v") {
		ids, _ := crictl(ctx, n, sock, "ps", "-a", "-q", "--label", "io.kubernetes.pod.name=cli")
		out, _ := crictl(ctx, n, sock, "logs", strings.TrimSpace(ids))
		if !strings.Contains(out, "kubegpu v") {
			t.Errorf("the CLI image printed %q (%v), want its version", out, err)
		}
	}
	// The dashboard's and the alerts' queries name metrics the chart's
	// scheduler and the shim export (scraped with cluster-admin's
	// certificate, through the chart's RBAC for delegated authorization).
	checkQueriedMetrics(t, scrape(t, shimMetrics)+scrapeTLS(t, "127.0.0.1:"+port))
	createPods(ctx, t, ns, gpuPodOn("on-sim-node", "helm-sim-0"))
	if p := boundPod(ctx, t, ns, "on-sim-node"); func() error { _, err := objects.PodAllocation(p); return err }() != nil {
		t.Errorf("pod on the simulated node has no allocation")
	}
	// Addressed to another scheduler: refused by the chart's policy.
	stray := gpuPodOn("stray", nodeName)
	stray.Spec.SchedulerName = "default-scheduler"
	_, err = tenant(t, ns).CoreV1().Pods(ns).Create(ctx, stray, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	refused(t, "a GPU pod for another scheduler", err, "kubegpu-scheduler-name", "spec.schedulerName: kubegpu-scheduler")

	// A changed configuration rolls the scheduler; it keeps scheduling.
	before := schedulerPod(ctx, t)
	helm(ctx, t, append([]string{"upgrade", "kg"}, append(common, "--set", "plugin.nodePolicy=spread")...)...)
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p := schedulerPod(ctx, t)
		return p != nil && p.UID != before.UID && podReady(p), nil
	}); err != nil {
		t.Fatal("the scheduler was not rolled to the new configuration:", err)
	}
	cm, err := cluster.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "kg-scheduler", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["config.yaml"], `nodePolicy: "spread"`) {
		t.Fatalf("configuration after the upgrade: %v\n%s", err, cm.Data["config.yaml"])
	}
	runsWithGPU("after-upgrade")

	// Uninstall leaves nothing of the release behind but what it keeps:
	// the policies (still in force), the PriorityClass and the
	// ClusterRoles, so that the objects it adopted stay.
	uninstall()
	// The objects of the shipped manifests (no release label) are kept,
	// every one; the release's own, the second-scheduler policy among
	// them, go.
	for _, obj := range manifestObjects(t, manifest) {
		_, ofRelease := obj.GetLabels()["app.kubernetes.io/instance"]
		keep := obj.GetAnnotations()["helm.sh/resource-policy"] == "keep"
		switch {
		case !ofRelease && obj.GetName() != "kubegpu-scheduler-name":
			if !keep {
				t.Errorf("%s %s of a shipped manifest is not marked to be kept", obj.GetKind(), obj.GetName())
			}
			if err := exists(ctx, obj); err != nil {
				t.Error(err)
			}
		case keep:
			t.Errorf("%s %s is kept by helm uninstall", obj.GetKind(), obj.GetName())
		default:
			if err := gone(ctx, obj); err != nil {
				t.Error(err)
			}
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return probePolicies(ctx, tenant(t, ns), ns, true), nil
	}); err != nil {
		for policy, probe := range policyProbes() {
			probe.Namespace = ""
			_, err := tenant(t, ns).CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil || !strings.Contains(err.Error(), policy) {
				t.Errorf("after helm uninstall, policy %s is not in force: its probe gave %v", policy, err)
			}
		}
	}
}

// schedulerPod is the chart's scheduler pod that is not being deleted
// (nil if none).
func schedulerPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	list, err := cluster.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=kg,app.kubernetes.io/component=scheduler"})
	if err != nil {
		return nil
	}
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			return &list.Items[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// schedulerPodLogs is what the chart's scheduler logged, for failures.
func schedulerPodLogs(ctx context.Context, t *testing.T) string {
	p := schedulerPod(ctx, t)
	if p == nil {
		return "(no scheduler pod)"
	}
	b, err := cluster.Client.CoreV1().Pods("kube-system").GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](40)}).DoRaw(ctx)
	if err != nil {
		return "scheduler logs: " + err.Error()
	}
	return string(b)
}

// manifestObjects parses a release's manifest.
func manifestObjects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(o) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: o})
	}
	if len(objs) < 10 {
		t.Fatalf("the release's manifest has %d objects", len(objs))
	}
	return objs
}

// exists reports whether obj exists.
func exists(ctx context.Context, obj *unstructured.Unstructured) error {
	get, err := getter(ctx, obj)
	if err != nil {
		return err
	}
	if err := get(); err != nil {
		return fmt.Errorf("helm uninstall removed %s %s, which it should keep: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// gone waits until obj no longer exists.
func gone(ctx context.Context, obj *unstructured.Unstructured) error {
	get, err := getter(ctx, obj)
	if err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return apierrors.IsNotFound(get()), nil
	}); err != nil {
		return &leftBehind{obj: obj}
	}
	return nil
}

// getter returns a function that gets obj.
func getter(ctx context.Context, obj *unstructured.Unstructured) (func() error, error) {
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	if err != nil {
		return nil, err
	}
	gvk := obj.GroupVersionKind()
	m, err := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)).RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	r := dyn.Resource(m.Resource)
	var get func() error
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = "kube-system"
		}
		get = func() error { _, err := r.Namespace(ns).Get(ctx, obj.GetName(), metav1.GetOptions{}); return err }
	} else {
		get = func() error { _, err := r.Get(ctx, obj.GetName(), metav1.GetOptions{}); return err }
	}
	return get, nil
}

type leftBehind struct{ obj *unstructured.Unstructured }

func (l *leftBehind) Error() string {
	return "helm uninstall left " + l.obj.GetKind() + " " + l.obj.GetNamespace() + "/" + l.obj.GetName() + " behind"
}

// scrapeTLS gets https://addr/metrics as cluster-admin (the scheduler's
// serving certificate is self-signed).
func scrapeTLS(t *testing.T, addr string) string {
	t.Helper()
	tlsCfg, err := rest.TLSConfigFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg.InsecureSkipVerify, tlsCfg.RootCAs, tlsCfg.ServerName = true, nil, ""
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s %v\n%s", addr, resp.Status, err, body)
	}
	return string(body)
}

// checkQueriedMetrics checks that every kubegpu metric the dashboard's
// panels and the alert rules query is in scraped (a histogram by its
// base name).
func checkQueriedMetrics(t *testing.T, scraped string) {
	t.Helper()
	var exprs []string
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "kubegpu.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if e, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, e)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	panels := len(exprs)
	rules, err := alertrules.ReadFile()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		exprs = append(exprs, r.Expr)
	}
	if panels < 20 || len(exprs)-panels < 14 {
		t.Fatalf("%d dashboard queries and %d alert rules read", panels, len(exprs)-panels)
	}
	names := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			names[m] = true
		}
		// Each of kubegpu's series is selected with its job, so that a
		// tenant's pod exporting series of the same names changes nothing.
		for _, sel := range alertrules.Unscoped(e) {
			t.Errorf("%s selects no job, in %q", sel, e)
		}
	}
	for name := range names {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(scraped, "# TYPE "+b+" histogram") {
				base = b
			}
		}
		if !strings.Contains(scraped, "# TYPE "+base+" ") {
			t.Errorf("the dashboard or the alerts query %s, which no component exports", name)
		}
	}
}

// metricName finds the metric names in PromQL that kubegpu's components
// export: kubegpu's own and the scheduler's leader election.
var metricName = regexp.MustCompile(`\b(kubegpu_[a-z0-9_]+|leader_election_master_status)\b`)

var updateGolden = flag.Bool("update", false, "rewrite the chart's golden files in testdata/helm")

// TestHelmTemplate: `helm template` of the chart, for the default values
// and for a configuration that sets most of them, is what
// testdata/helm/*.yaml hold (go test -run TestHelmTemplate -update
// rewrites them). The documents the chart takes from files (the admission
// policies, the viewer role, the alert rules) are tested where those files
// are made, so the golden files only name them.
func TestHelmTemplate(t *testing.T) {
	ctx := context.Background()
	chart := filepath.Join(repoRoot, "deploy", "helm", "kubegpu")
	values := filepath.Join(t.TempDir(), "values.yaml")
	// A fixed public key: the golden files must not change with the test's.
	if err := os.WriteFile(values, []byte("nodesPublicKey: |\n  -----BEGIN PUBLIC KEY-----\n  MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n  -----END PUBLIC KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		// The default image tag is the chart's appVersion, make image's tag.
		"default": nil,
		"only": {"--set", "image.tag=v0.0.0-test", "--set", "mode=only", "--set", "plugin.writeAllocation=PreBind", "--set", "plugin.nodePolicy=binpack",
			"--set", "plugin.pluginOptions={nvidia.nvml-library=/usr/lib/libnvidia-ml.so.1}",
			"--set", "verificationKeys.secretName=kubegpu-old-key", "--set", "hostNetwork=true", "--set", "securePort=10269",
			"--set", "apiServer.host=10.0.0.10", "--set", "apiServer.port=6443", "--set", "featureGates=GenericWorkload=true",
			"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true", "-f", values},
		// Beside the stock scheduler on a dedicated node pool, watched by a
		// Prometheus in namespace monitoring, behind a NetworkPolicy.
		"monitored": {"--set", "image.tag=v0.0.0-test", "--set", "replicaCount=3", "--set", "podDisruptionBudget.maxUnavailable=34%",
			"--set", "nodeSelector.node-role\\.kubernetes\\.io/control-plane=null", "--set-string", "nodeSelector.kubegpu\\.io/scheduler-pool=true",
			"--set-json", `tolerations=[{"key":"kubegpu.io/scheduler-pool","operator":"Exists","effect":"NoSchedule"}]`,
			"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.sampleLimit=20000",
			"--set", "metrics.serviceMonitor.labelValueLengthLimit=256", "--set", "metrics.serviceMonitor.labels.release=prometheus",
			"--set", "plugin.gpuMetrics=PerModel", "--set", "ui.enabled=true", "--set", "ui.existingTokenSecret=kubegpu-ui-token", "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.metricsPodSelector.matchLabels.app\\.kubernetes\\.io/name=prometheus"},
	} {
		t.Run(name, func(t *testing.T) {
			out := helm(ctx, t, append([]string{"template", "kubegpu", chart, "--namespace", "kube-system", "--kube-version", "1.37.2"}, args...)...)
			got := goldenView(out)
			path := filepath.Join("testdata", "helm", name+".yaml")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("helm template with %s values differs from %s (go test -run TestHelmTemplate -update rewrites it):\n%s", name, path, got)
			}
		})
	}

	// The alert rules select the jobs the chart's ServiceMonitor and the
	// shims' scrapes are named.
	out := helm(ctx, t, "template", "kubegpu", chart, "--namespace", "kube-system", "--kube-version", "1.37.2",
		"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.schedulerJob=gpu-scheduler", "--set", "metrics.crishimJob=gpu-nodes")
	var rules, service string
	for _, doc := range strings.Split(out, "\n---\n") {
		switch {
		case strings.Contains(doc, "kind: PrometheusRule"):
			rules = doc
		case strings.Contains(doc, "kind: Service\n"):
			service = doc
		}
	}
	if !strings.Contains(service, "kubegpu.io/job: gpu-scheduler") {
		t.Errorf("the Service does not name the job gpu-scheduler:\n%s", service)
	}
	if strings.Count(rules, `job="gpu-scheduler"`) < 10 || strings.Count(rules, `job="gpu-nodes"`) < 3 ||
		strings.Contains(rules, `job="kubegpu-`) {
		t.Errorf("the PrometheusRule does not select the jobs gpu-scheduler and gpu-nodes:\n%s", rules)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []alertrules.Rule `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := sigsyaml.Unmarshal([]byte(rules), &rule); err != nil || len(rule.Spec.Groups) == 0 {
		t.Fatalf("the PrometheusRule: %v\n%s", err, rules)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			for _, sel := range alertrules.Unscoped(r.Expr) {
				t.Errorf("the PrometheusRule's %s: %s selects no job", r.Alert, sel)
			}
		}
	}

	// Values the schema or the templates refuse, with the words that say
	// why.
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "mode=both"}, "/mode"},
		{[]string{"--set", "plugin.nodePolicy=fastest"}, "/plugin/nodePolicy"},
		{[]string{"--set", "plugin.unknownArg=1"}, "unknownArg"},
		{[]string{"--set", "schedulerName=Bad\"Name"}, "/schedulerName"},
		// The stock scheduler's name in mode second: two schedulers would
		// serve default-scheduler.
		{[]string{"--set", "schedulerName=default-scheduler"}, "/schedulerName"},
		// A budget that blocks every drain.
		{[]string{"--set", "podDisruptionBudget.maxUnavailable=0"}, "/podDisruptionBudget/maxUnavailable"},
		{[]string{"--set-string", "podDisruptionBudget.maxUnavailable=0%"}, "/podDisruptionBudget/maxUnavailable"},
		// Typos, at the top and nested.
		{[]string{"--set", "replicaCont=3"}, "replicaCont"},
		{[]string{"--set", "image.tga=v1"}, "tga"},
		{[]string{"--set", "metrics.serviceMonitor.enable=true"}, "enable"},
		{[]string{"--set", "podDisruptionBudget.maxUnavaliable=1"}, "maxUnavaliable"},
		// Durations without a unit.
		{[]string{"--set", "plugin.heartbeatStaleness=40"}, "/plugin/heartbeatStaleness"},
		{[]string{"--set", "plugin.workloadHalfLife=1 day"}, "/plugin/workloadHalfLife"},
		{[]string{"--set", "metrics.serviceMonitor.interval=30"}, "/metrics/serviceMonitor/interval"},
		// Only PEM PUBLIC KEY blocks are published to nodes.
		{[]string{"--set-string", "nodesPublicKey=-----BEGIN PRIVATE KEY-----"}, "private key"},
		{[]string{"--set-string", "nodesPublicKey=-----BEGIN KUBEGPU HMAC-SHA256 SECRET-----\nc2VjcmV0\n-----END KUBEGPU HMAC-SHA256 SECRET-----"}, "KUBEGPU HMAC-SHA256 SECRET block"},
		{[]string{"--set-string", "nodesPublicKey=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5"}, "no PEM block"},
		// The identity point, a "placeholder" key with which forgeries verify.
		{[]string{"--set-string", "nodesPublicKey=-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n-----END PUBLIC KEY-----"}, "small order"},
		{[]string{"--set", "mode=only", "--set", "replicaCount=1"}, "replicaCount of 2 or more"},
		{[]string{"--set", "leaderElection.enabled=false"}, "leaderElection.enabled=false"},
		{[]string{"--set", "apiServer.host=10.0.0.10"}, "apiServer.port"},
		// v1.36's second gang gate, gone in v1.37: kube-scheduler would not start.
		{[]string{"--set", "featureGates=GenericWorkload=true\\,GangScheduling=true"}, "no GangScheduling gate"},
		{[]string{"--set", "hostNetwork=true"}, "securePort"},
		{[]string{"--set", "hostNetwork=true", "--set", "securePort=10269", "--set", "networkPolicy.enabled=true"}, "host's network"},
	} {
		bin := filepath.Join(nodeBinDir, "helm")
		out, err := exec.CommandContext(ctx, bin, append([]string{"template", "kubegpu", chart, "--kube-version", "1.37.2"}, bad.args...)...).CombinedOutput()
		switch {
		case err == nil:
			t.Errorf("helm template %v: accepted", bad.args)
		case !strings.Contains(string(out), "values don't meet the specifications of the schema") && !strings.Contains(string(out), "execution error"):
			t.Errorf("helm template %v: %s", bad.args, out)
		case !strings.Contains(string(out), bad.want):
			t.Errorf("helm template %v: refused without naming %q:\n%s", bad.args, bad.want, out)
		}
	}
}

// goldenView is helm's output without the documents the chart takes from
// files, which it lists by kind and name instead.
func goldenView(out string) string {
	var b strings.Builder
	for _, doc := range strings.Split(out, "\n---\n") {
		if strings.Contains(doc, "# Source: kubegpu/templates/admission-policies.yaml") ||
			strings.Contains(doc, "# Source: kubegpu/templates/viewer.yaml") ||
			strings.Contains(doc, "# Source: kubegpu/templates/capacity.yaml") ||
			strings.Contains(doc, "# Source: kubegpu/templates/prometheusrule.yaml") {
			var kind, name string
			for _, l := range strings.Split(doc, "\n") {
				if v, ok := strings.CutPrefix(l, "kind: "); ok && kind == "" {
					kind = v
				}
				if v, ok := strings.CutPrefix(l, "  name: "); ok && name == "" {
					name = v
				}
			}
			fmt.Fprintf(&b, "# (from a file) %s %s\n", kind, name)
			continue
		}
		b.WriteString("---\n" + strings.TrimPrefix(doc, "---\n") + "\n")
	}
	return b.String()
}
