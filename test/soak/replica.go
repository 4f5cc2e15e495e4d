package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// proxies are the TCP proxies between each scheduler replica and the API
// server (toxiproxy, in this process): a fault black-holes, delays or
// resets one replica's connections while its process keeps running.
type proxies struct {
	server   *toxiproxy.ApiServer
	upstream string
}

func newProxies(c *localcluster.Cluster) (*proxies, error) {
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	var upstream string
	for _, cl := range cfg.Clusters {
		upstream = strings.TrimPrefix(cl.Server, "https://")
	}
	if upstream == "" {
		return nil, fmt.Errorf("no API server in %s", c.Kubeconfig)
	}
	return &proxies{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()), upstream: upstream}, nil
}

// add starts a proxy to the API server on a free loopback port.
func (p *proxies) add(name string) (*toxiproxy.Proxy, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	proxy := toxiproxy.NewProxy(p.server, name, addr, p.upstream)
	if err := p.server.Collection.Add(proxy, true); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	return proxy, nil
}

func (p *proxies) stop() { _ = p.server.Collection.Clear() }

// toxic adds a toxic (toxiproxy's JSON: name, type, stream, attributes)
// to a proxy.
func toxic(proxy *toxiproxy.Proxy, name, typ, stream string, attributes map[string]int) error {
	var attrs []string
	for k, v := range attributes {
		attrs = append(attrs, fmt.Sprintf("%q:%d", k, v))
	}
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{%s}}`, name, typ, stream, strings.Join(attrs, ","))
	_, err := proxy.Toxics.AddToxicJson(strings.NewReader(body))
	return err
}

// replica is one kubegpu-scheduler process with the shipped configuration
// and leader election on, its client going through a proxy of its own.
type replica struct {
	name  string
	s     *soak
	proxy *toxiproxy.Proxy
	// kubeconfig is the scheduler's identity, through the proxy.
	kubeconfig string

	mu      sync.Mutex
	sched   *localcluster.Scheduler
	signing string // private key file
	verify  string // extra verification keys file, or ""
	starts  int
	// failedStarts counts starts that failed (the supervisor retries).
	failedStarts int
	// stopped is set when the soak stops the replica for good.
	stopped bool
}

// Leader election of the shipped configuration: upstream's defaults.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

func (s *soak) startReplica(ctx context.Context, name string) (*replica, error) {
	proxy, err := s.proxies.add("scheduler-" + name)
	if err != nil {
		return nil, err
	}
	id, err := s.cluster.Identity(localcluster.SchedulerUser)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.LoadFromFile(id.Kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + proxy.Listen
	}
	kubeconfig := filepath.Join(s.dir, "scheduler-"+name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		return nil, err
	}
	r := &replica{name: name, s: s, proxy: proxy, kubeconfig: kubeconfig, signing: s.keys.gen(0).private}
	return r, r.start(ctx)
}

// start starts the process; r.mu held or r not yet shared.
func (r *replica) start(ctx context.Context) error {
	extra := []string{"heartbeatStaleness: " + heartbeatStaleness.String()}
	if r.verify != "" {
		extra = append(extra, "verificationKeysFile: "+r.verify)
	}
	config, err := r.s.cluster.ShippedSchedulerConfig(filepath.Join(repoRoot(), "kube-scheduler/config/kubegpu-scheduler.yaml"),
		r.kubeconfig, r.s.o.pluginDir, r.signing, 100, extra...)
	if err != nil {
		return err
	}
	if config, err = localcluster.WithLeaderElection(config, leaseDuration, renewDeadline, retryPeriod); err != nil {
		return err
	}
	id, err := r.s.cluster.Identity(localcluster.SchedulerUser)
	if err != nil {
		return err
	}
	// Delegated authentication and authorization of /metrics go to the
	// API server directly: only the scheduling client is behind the proxy.
	sched, err := r.s.cluster.StartScheduler(ctx, filepath.Join(r.s.o.binDir, "kubegpu-scheduler"), config, "kubegpu-scheduler-"+r.name, "--v=2",
		// Gangs (PodGroups), as the test cluster's API server serves them.
		"--feature-gates=GenericWorkload=true",
		"--authentication-kubeconfig="+id.Kubeconfig, "--authorization-kubeconfig="+id.Kubeconfig)
	if err != nil {
		return fmt.Errorf("replica %s: %w", r.name, err)
	}
	r.sched = sched
	r.starts++
	return nil
}

// restart stops the replica and starts it signing with signing (a private
// key file) and counting verify's keys too.
func (r *replica) restart(ctx context.Context, signing, verify string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sched != nil {
		if err := r.sched.Stop(); err != nil {
			// Killed after its grace period: down either way.
			logf("replica %s: %v", r.name, err)
		}
		r.sched = nil
	}
	if signing != "" {
		r.signing, r.verify = signing, verify
	}
	return r.start(ctx)
}

// restarts is how many times the replica was started after its first
// start (by a fault, or by its supervisor after it exited), and how many
// starts failed.
func (r *replica) restarts() (started, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts - 1, r.failedStarts
}

// supervise starts the replica again when its process exits, as its
// Deployment's kubelet would: kube-scheduler exits when it loses its
// leader lease.
func (r *replica) supervise(ctx context.Context, stopping <-chan struct{}) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-stopping:
			return
		case <-t.C:
		}
		r.mu.Lock()
		if r.sched != nil && r.sched.Exited() {
			logf("replica %s exited (%s); starting it again", r.name, r.sched.Log)
			r.sched = nil
		}
		// Down (exited, or a start that failed): start it, again and
		// again, as a Deployment's kubelet would.
		if r.sched == nil && !r.stopped {
			if err := r.start(ctx); err != nil {
				r.failedStarts++
				logf("replica %s: %v", r.name, err)
			}
		}
		r.mu.Unlock()
	}
}

func (r *replica) stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.sched == nil {
		return nil
	}
	err := r.sched.Stop()
	r.sched = nil
	return err
}

// process returns the replica's PID and metrics port (0, 0 while down).
func (r *replica) process() (pid, port int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sched == nil {
		return 0, 0
	}
	return r.sched.Pid(), r.sched.Port
}

// scrape reads the named samples (without labels, or with the labels
// given in the name as Prometheus prints them) from the replica's
// /metrics as the viewer.
func (r *replica) scrape(ctx context.Context, names ...string) (map[string]float64, error) {
	_, port := r.process()
	if port == 0 {
		return nil, fmt.Errorf("replica %s is down", r.name)
	}
	cert, err := tls.X509KeyPair(r.s.viewer.Config.CertData, r.s.viewer.Config.KeyData)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed
	return scrape(ctx, client, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), names...)
}

// scrape gets a Prometheus text page and returns the named samples.
func scrape(ctx context.Context, client *http.Client, url string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	for sc := bufio.NewScanner(bytes.NewReader(body)); sc.Scan(); {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || !want[line[:i]] {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}

// rss is a process's resident memory in bytes, from /proc.
func rss(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

func freeAddr() (string, error) {
	port, err := localcluster.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// repoRoot is the repository's root, where the soak runs (make soak runs
// it there; validate checks).
func repoRoot() string {
	wd, _ := os.Getwd()
	return wd
}
