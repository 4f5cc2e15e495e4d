package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configure a local control plane.
type Options struct {
	// Dir holds every file of the cluster: certificates, etcd data, logs,
	// the kubeconfig. It must exist.
	Dir string
	// APIServer is the kube-apiserver binary.
	APIServer string
	// Etcd is the etcd binary (default: etcd on PATH).
	Etcd string
	// ControllerManager is the kube-controller-manager binary. Without it
	// nothing aggregates the built-in roles, tracks quota or removes the
	// not-ready taint of new nodes; Start then only creates the default
	// ServiceAccount and root CA ConfigMap of the namespaces it is asked for.
	ControllerManager string
	// Controllers is kube-controller-manager's --controllers (default "*",
	// every controller a production control plane runs).
	Controllers string
}

// Cluster is an etcd, a kube-apiserver and a kube-controller-manager on
// loopback, configured as kubeadm configures a production control plane:
// Node and RBAC authorization; NodeRestriction and the default admission
// plugins, ValidatingAdmissionPolicy and MutatingAdmissionPolicy among them;
// Pod Security admission enforcing the baseline profile outside
// kube-system.
type Cluster struct {
	opts Options
	pki  *pki

	// Kubeconfig is the path of an admin (system:masters) kubeconfig, for
	// installing and cleaning up only: every component and user gets an
	// Identity of its own.
	Kubeconfig string
	// Config is the admin client configuration.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface

	etcdURL     string
	etcdPeerURL string
	port        int
	etcd        *Process
	apiserver   *Process
	kcm         *Process

	idMu       sync.Mutex
	identities map[string]*Identity
}

// Start starts etcd, kube-apiserver and (if given) kube-controller-manager
// and waits until they are ready, with the default ServiceAccount in the
// default namespace.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.APIServer == "" {
		return nil, errors.New("localcluster: no kube-apiserver binary given")
	}
	if opts.Etcd == "" {
		opts.Etcd = "etcd"
	}
	if opts.Controllers == "" {
		opts.Controllers = "*"
	}
	for _, bin := range []string{opts.APIServer, opts.Etcd, opts.ControllerManager} {
		if bin == "" {
			continue
		}
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("localcluster: %w (run make deps / make kube-binaries)", err)
		}
	}
	started := &Cluster{opts: opts, identities: map[string]*Identity{}}
	c = started
	defer func() {
		if err != nil {
			started.Stop() // c is nil by now
		}
	}()
	if c.pki, err = newPKI(opts.Dir); err != nil {
		return nil, fmt.Errorf("localcluster: %w", err)
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if c.port, err = FreePort(); err != nil {
		return nil, err
	}
	if err := c.writeKubeconfig(); err != nil {
		return nil, err
	}
	if err := c.writeAdmissionConfig(); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.startControllerManager(ctx); err != nil {
		return nil, err
	}
	if err := c.EnsureNamespace(ctx, metav1.NamespaceDefault); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	clientPort, err := FreePort()
	if err != nil {
		return err
	}
	peerPort, err := FreePort()
	if err != nil {
		return err
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(clientPort)
	c.etcdPeerURL = "http://127.0.0.1:" + strconv.Itoa(peerPort)
	return c.runEtcd(ctx)
}

// runEtcd starts etcd on the cluster's URLs and data directory.
func (c *Cluster) runEtcd(ctx context.Context) error {
	var err error
	c.etcd, err = StartProcess(filepath.Join(c.opts.Dir, "etcd.log"), c.opts.Etcd,
		"--name=kubegpu", "--data-dir="+filepath.Join(c.opts.Dir, "etcd"),
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+c.etcdPeerURL, "--initial-advertise-peer-urls="+c.etcdPeerURL,
		"--initial-cluster=kubegpu="+c.etcdPeerURL, "--log-level=warn")
	if err != nil {
		return fmt.Errorf("localcluster: start etcd: %w", err)
	}
	return c.etcd.WaitFor(ctx, 30*time.Second, func(ctx context.Context) error {
		return dial(ctx, strings.TrimPrefix(c.etcdURL, "http://"))
	})
}

// RestartEtcd kills etcd, as a crash would, and starts it again on the same
// data and URLs; kube-apiserver keeps running and reconnects.
func (c *Cluster) RestartEtcd(ctx context.Context) error {
	if c.etcd != nil {
		if err := c.etcd.Kill(); err != nil {
			return fmt.Errorf("localcluster: kill etcd: %w", err)
		}
		c.etcd = nil
	}
	return c.runEtcd(ctx)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// cluster's port and waits until it is ready. A running
// kube-controller-manager is restarted with it: while the API server came
// up, it answered kube-controller-manager's watches with Forbidden (its
// authorizer not yet synced), and kube-controller-manager's informers would
// sit out their backoff, up to half a minute, before the node lifecycle
// controller sees new nodes again.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if c.kcm != nil {
		_ = c.kcm.Stop()
		c.kcm = nil
		if err := c.startAPIServer(ctx); err != nil {
			return err
		}
		return c.startControllerManager(ctx)
	}
	return c.startAPIServer(ctx)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	var err error
	c.apiserver, err = StartProcess(filepath.Join(c.opts.Dir, "kube-apiserver.log"), c.opts.APIServer,
		"--etcd-servers="+c.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		// v1.37 refuses a loopback address for the default (lease)
		// endpoint reconciler, which would publish it as the endpoint of
		// the kubernetes Service, unreachable from pods anyway: pods that
		// need the API server here are told its address (the chart's
		// apiServer.host) and run on the host's network.
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(c.port),
		"--cert-dir="+filepath.Join(c.opts.Dir, "apiserver-certs"),
		"--tls-cert-file="+c.pki.serverCertFile, "--tls-private-key-file="+c.pki.serverKeyFile,
		"--client-ca-file="+c.pki.caFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+c.pki.saKeyFile,
		"--service-account-signing-key-file="+c.pki.saKeyFile,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		// The default plugins (NamespaceLifecycle, ServiceAccount,
		// PodSecurity, ResourceQuota, ValidatingAdmissionPolicy,
		// MutatingAdmissionPolicy, ...) and NodeRestriction, as kubeadm
		// enables it.
		"--enable-admission-plugins=NodeRestriction",
		"--admission-control-config-file="+c.admissionConfigFile(),
		"--kubelet-client-certificate="+c.pki.kubeletClientCertFile,
		"--kubelet-client-key="+c.pki.kubeletClientKeyFile,
		// Nodes by their InternalIP, as kubeadm sets it: node names do
		// not resolve here.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--enable-priority-and-fairness=false",
		// Gang scheduling (PodGroups, scheduling.k8s.io/v1beta1) is
		// beta and off by default in v1.37: served so that
		// kubegpu-scheduler's all-or-nothing groups can be tested; inert
		// for pods that name no group.
		"--feature-gates=GenericWorkload=true",
		"--runtime-config=scheduling.k8s.io/v1beta1=true",
		"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
		"--v=1")
	if err != nil {
		return fmt.Errorf("localcluster: start kube-apiserver: %w", err)
	}
	return c.apiserver.WaitFor(ctx, 90*time.Second, c.ready)
}

// ready checks the API server's /readyz.
func (c *Cluster) ready(ctx context.Context) error {
	body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w: %s", err, body)
	}
	return nil
}

// StopAPIServer stops kube-apiserver; etcd keeps the state.
func (c *Cluster) StopAPIServer() error {
	if c.apiserver == nil {
		return nil
	}
	err := c.apiserver.Stop()
	c.apiserver = nil
	return err
}

// KillAPIServer ends kube-apiserver at once, as a crash would; etcd keeps
// the state.
func (c *Cluster) KillAPIServer() error {
	if c.apiserver == nil {
		return nil
	}
	err := c.apiserver.Kill()
	c.apiserver = nil
	return err
}

// Stop stops every process. The files stay in Dir.
func (c *Cluster) Stop() {
	if c.kcm != nil {
		_ = c.kcm.Stop()
		c.kcm = nil
	}
	_ = c.StopAPIServer()
	if c.etcd != nil {
		_ = c.etcd.Stop()
		c.etcd = nil
	}
}

// APIServerLog is the path of kube-apiserver's log.
func (c *Cluster) APIServerLog() string { return filepath.Join(c.opts.Dir, "kube-apiserver.log") }

func (c *Cluster) writeKubeconfig() error {
	c.Kubeconfig = filepath.Join(c.opts.Dir, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.server(), c.pki.caCert, c.pki.adminCert, c.pki.adminKey, "admin"); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("localcluster: %w", err)
	}
	rc.QPS, rc.Burst = 500, 1000
	c.Config = rc
	c.Client, err = kubernetes.NewForConfig(rc)
	return err
}

// EnsureNamespace creates a namespace, if missing, with the given labels
// (e.g. Pod Security levels), and waits until kube-controller-manager has
// given it its default ServiceAccount (the ServiceAccount admission plugin
// requires it of pods) and kube-root-ca.crt ConfigMap (kubelet mounts it
// into pods). Without a controller-manager it creates both itself.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string, labels ...map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	for _, l := range labels {
		for k, v := range l {
			ns.Labels[k] = v
		}
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			last = err
			return false, nil
		}
		if c.opts.ControllerManager == "" {
			_, err = c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				last = err
				return false, nil
			}
			_, err = c.Client.CoreV1().ConfigMaps(name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
				Data: map[string]string{"ca.crt": string(c.pki.caCert)}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				last = err
				return false, nil
			}
			return true, nil
		}
		if _, err := c.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			last = fmt.Errorf("default ServiceAccount not created by kube-controller-manager yet: %w", err)
			return false, nil
		}
		if _, err := c.Client.CoreV1().ConfigMaps(name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			last = fmt.Errorf("kube-root-ca.crt not published by kube-controller-manager yet: %w", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("localcluster: namespace %s: %w (last: %w)", name, err, last)
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func dial(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Process is a child process whose output goes to a log file. It runs in its
// own process group, so Stop also ends its children.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProcess starts bin with args, writing stdout and stderr to logPath.
func StartProcess(logPath, bin string, args ...string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &Process{Name: filepath.Base(bin), Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitFor polls check until it succeeds, the process exits, or timeout.
func (p *Process) WaitFor(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited (%w); see %s", p.Name, p.err, p.Log)
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; see %s", p.Name, timeout, last, p.Log)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop sends SIGTERM to the process group and SIGKILL after 30 s.
func (p *Process) Stop() error { return p.signal(syscall.SIGTERM, 30*time.Second) }

// Kill ends the process group at once, as a crash would.
func (p *Process) Kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Process) signal(sig syscall.Signal, grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %s; killed", p.Name, grace)
	}
}

// CPUTime is the CPU time (user and system) the process has used so far.
func (p *Process) CPUTime() (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	rest := string(stat)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", p.cmd.Process.Pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// APIServer is the running kube-apiserver process.
func (c *Cluster) APIServer() *Process { return c.apiserver }

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }
