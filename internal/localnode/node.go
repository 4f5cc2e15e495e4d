package localnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// Namespace is the containerd namespace the CRI plugin keeps pods,
// containers and images in.
const Namespace = "k8s.io"

// The make target that builds the node's binaries, named in errors.
const buildHint = "build them with make node-binaries (hack/node-binaries.sh) into _output/tools/bin"

// Options configure a local node.
type Options struct {
	// Dir holds every file of the node: containerd's root and state, its
	// configuration and log, the CNI and CDI configuration, the runc state.
	// It must exist. Its path must be short enough for a unix socket
	// (Dir/containerd.sock under 108 bytes).
	Dir string
	// BinDir holds containerd, containerd-shim-runc-v2, ctr and crictl, as
	// make node-binaries builds them into _output/tools/bin.
	BinDir string
	// Containerd, Shim, Ctr and Crictl override single binaries of BinDir.
	Containerd, Shim, Ctr, Crictl string
	// Runc is the OCI runtime (default: runc on PATH, Debian's runc).
	Runc string
	// CNIBinDir holds the CNI plugins bridge, host-local, loopback and
	// portmap (default /usr/lib/cni, Debian's containernetworking-plugins).
	CNIBinDir string
	// Snapshotter is containerd's snapshotter (default "overlayfs"; "native"
	// where the node's directory is on a filesystem overlayfs cannot use).
	Snapshotter string
	// Busybox is the static busybox the pause image is built from
	// (default /bin/busybox, Debian's busybox-static).
	Busybox string
	// LogLevel is containerd's log level (default "info").
	LogLevel string
	// ReadyTimeout bounds how long Start and Restart wait for containerd's
	// CRI to report ready (default 60 s).
	ReadyTimeout time.Duration
}

// Node is a containerd with its CRI plugin, running as a child process.
// Ctr, Crictl, ImportImage, TagImage and MirrorRegistry may run
// concurrently; Kill, Restart and Stop must not run concurrently with
// anything else.
type Node struct {
	// Dir is the node's directory (Options.Dir, symbolic links resolved).
	Dir string
	// Socket is containerd's gRPC socket, which also serves CRI: the path of
	// the CRI endpoint (Endpoint is its URL).
	Socket string
	// CDISpecDir is where containerd reads CDI specs. A spec written there
	// is seen by the next CreateContainer; no restart needed.
	CDISpecDir string
	// Namespace is the containerd namespace CRI uses, "k8s.io".
	Namespace string
	// RegistryHostsDir is containerd's registry configuration directory
	// (config_path): HOST/hosts.toml per registry; see MirrorRegistry.
	RegistryHostsDir string
	// Config is containerd's configuration file; Log is its log.
	Config, Log string
	// Bridge and Subnet are the pods' network: a Linux bridge of the node's
	// own with a /24 of its own, created by Start (the CNI bridge plugin
	// takes it on with the first pod) and deleted by Stop.
	Bridge, Subnet string
	// IP is the bridge's address, the pods' gateway: the node's address,
	// where its kubelet serves the API server (logs, exec), as loopback
	// addresses are no node address to kubelet.
	IP string

	opts       Options
	proc       *localcluster.Process
	cniNetwork string
}

// Start writes the node's configuration, starts containerd, waits until its
// CRI reports the runtime and the network ready, and imports PauseImage, the
// pod sandbox image. On error nothing is left running.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	if err := opts.resolve(); err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("localnode: node directory: %w", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("localnode: node directory: %w", err)
	}
	n = &Node{
		Dir:        dir,
		Socket:     filepath.Join(dir, "containerd.sock"),
		CDISpecDir: filepath.Join(dir, "cdi"),
		Namespace:  Namespace,

		RegistryHostsDir: filepath.Join(dir, "certs.d"),
		Config:           filepath.Join(dir, "containerd.toml"),
		Log:              filepath.Join(dir, "containerd.log"),
		opts:             opts,
	}
	if len(n.Socket)+len(".ttrpc") >= 108 {
		return nil, fmt.Errorf("localnode: node directory %s is too long for a unix socket path; use a shorter one", dir)
	}
	defer func() {
		if err != nil {
			_ = n.Stop()
			n = nil
		}
	}()
	if err := n.writeConfig(); err != nil {
		return n, err
	}
	if err := n.createBridge(ctx); err != nil {
		return n, err
	}
	if err := n.start(ctx); err != nil {
		return n, err
	}
	pause := filepath.Join(dir, "images", "pause.tar")
	if err := WriteImageArchive(pause, ImageSpec{Names: []string{PauseImage},
		Entrypoint: []string{"sleep", "inf"}, Busybox: opts.Busybox}); err != nil {
		return n, fmt.Errorf("localnode: %w", err)
	}
	if err := n.ImportImage(ctx, pause); err != nil {
		return n, err
	}
	return n, nil
}

// resolve fills in defaults and checks that every binary exists, naming
// the one missing and how to get it.
func (o *Options) resolve() error {
	if o.Dir == "" {
		return errors.New("localnode: no node directory given (Options.Dir)")
	}
	if o.BinDir != "" {
		// Relative to the working directory (the package's under go test);
		// errors show where that is.
		if abs, err := filepath.Abs(o.BinDir); err == nil {
			o.BinDir = abs
		}
	}
	if o.BinDir == "" && (o.Containerd == "" || o.Shim == "" || o.Ctr == "" || o.Crictl == "") {
		return fmt.Errorf("localnode: no binary directory: set Options.BinDir to the directory of containerd, containerd-shim-runc-v2, ctr and crictl; %s", buildHint)
	}
	bin := func(p *string, name string) error {
		if *p == "" {
			*p = filepath.Join(o.BinDir, name)
		}
		found, err := exec.LookPath(*p)
		if err != nil {
			return fmt.Errorf("localnode: %s binary not found at %s: %s", name, *p, buildHint)
		}
		// containerd takes only absolute paths to runtime binaries.
		if *p, err = filepath.Abs(found); err != nil {
			return fmt.Errorf("localnode: %s: %w", name, err)
		}
		return nil
	}
	if err := errors.Join(bin(&o.Containerd, "containerd"), bin(&o.Shim, "containerd-shim-runc-v2"),
		bin(&o.Ctr, "ctr"), bin(&o.Crictl, "crictl")); err != nil {
		return err
	}
	if o.Runc == "" {
		o.Runc = "runc"
	}
	runc, err := exec.LookPath(o.Runc)
	if err != nil {
		return fmt.Errorf("localnode: runc not found (%w): install Debian's runc (make deps)", err)
	}
	if o.Runc, err = filepath.Abs(runc); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	if o.CNIBinDir == "" {
		o.CNIBinDir = "/usr/lib/cni"
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(o.CNIBinDir, p)); err != nil {
			return fmt.Errorf("localnode: CNI plugin %s not found in %s: install Debian's containernetworking-plugins (make deps)", p, o.CNIBinDir)
		}
	}
	if o.Snapshotter == "" {
		o.Snapshotter = "overlayfs"
	}
	if o.Busybox == "" {
		o.Busybox = DefaultBusybox
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	return nil
}

// writeConfig writes containerd's and CNI's configuration and makes the
// directories they name.
func (n *Node) writeConfig() error {
	d := func(parts ...string) string { return filepath.Join(append([]string{n.Dir}, parts...)...) }
	for _, p := range []string{d("root"), d("state"), d("tmp"), d("opt"), d("runc"), d("images"),
		n.CDISpecDir, n.RegistryHostsDir, d("cni", "net.d"), d("cni", "ipam")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("localnode: %w", err)
		}
	}
	network, err := newBridgeNetwork(n.Dir, d("cni", "ipam"), hostSubnetInUse)
	if err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	n.Bridge, n.Subnet, n.cniNetwork, n.IP = network.Bridge, network.Subnet.String(), network.Name, network.Gateway.String()
	conflist, err := network.conflist()
	if err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	if err := os.WriteFile(d("cni", "net.d", "10-kubegpu.conflist"), conflist, 0o644); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	cfg := containerdConfig{
		Root: d("root"), State: d("state"), Temp: d("tmp"), Opt: d("opt"),
		Socket: n.Socket, TTRPC: n.Socket + ".ttrpc",
		RuncRoot: d("runc"), Runc: n.opts.Runc, Shim: n.opts.Shim,
		CNIBinDir: n.opts.CNIBinDir, CNIConfDir: d("cni", "net.d"),
		CDISpecDir: n.CDISpecDir, RegistryHostsDir: n.RegistryHostsDir, Snapshotter: n.opts.Snapshotter,
		PauseImage: PauseImage, LogLevel: n.opts.LogLevel,
	}
	if err := os.WriteFile(n.Config, []byte(cfg.render()), 0o644); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	return nil
}

// start starts containerd and waits until its CRI is ready.
func (n *Node) start(ctx context.Context) error {
	proc, err := localcluster.StartProcess(n.Log, n.opts.Containerd, "--config", n.Config)
	if err != nil {
		return fmt.Errorf("localnode: start containerd: %w", err)
	}
	n.proc = proc
	if err := proc.WaitFor(ctx, n.opts.ReadyTimeout, n.criReady); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	return nil
}

// criReady checks that the CRI answers and reports the runtime and the
// network ready.
func (n *Node) criReady(ctx context.Context) error {
	out, err := n.Crictl(ctx, "info")
	if err != nil {
		return err
	}
	var info struct {
		Status struct {
			Conditions []struct {
				Type    string `json:"type"`
				Status  bool   `json:"status"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("crictl info: %w", err)
	}
	ready := map[string]bool{}
	var notReady []string
	for _, c := range info.Status.Conditions {
		ready[c.Type] = c.Status
		if !c.Status {
			notReady = append(notReady, fmt.Sprintf("%s: %s %s", c.Type, c.Reason, c.Message))
		}
	}
	if !ready["RuntimeReady"] || !ready["NetworkReady"] {
		return fmt.Errorf("CRI not ready: %s", strings.Join(notReady, "; "))
	}
	return nil
}

// Endpoint is the CRI endpoint URL, unix:// and the socket path.
func (n *Node) Endpoint() string { return "unix://" + n.Socket }

// Process is the running containerd process (nil after Stop or Kill).
func (n *Node) Process() *localcluster.Process { return n.proc }

// Kill ends containerd at once, as a crash would. Shims and containers keep
// running; Restart brings containerd back to them.
func (n *Node) Kill() error {
	if n.proc == nil {
		return nil
	}
	err := n.proc.Kill()
	n.proc = nil
	return err
}

// Restart kills containerd (unless Kill already did), starts it again on
// the same directories and socket, and waits until its CRI is ready:
// containerd reconnects to the shims of the containers still running.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.Kill(); err != nil {
		return fmt.Errorf("localnode: kill containerd: %w", err)
	}
	return n.start(ctx)
}

// ImportImage imports an image archive (docker save or OCI layout tar, as
// WriteImageArchive writes) into the CRI namespace and unpacks it.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	if _, err := n.Ctr(ctx, "images", "import", "--snapshotter", n.opts.Snapshotter, archive); err != nil {
		return fmt.Errorf("localnode: import image %s: %w", archive, err)
	}
	return nil
}

// MirrorRegistry makes containerd pull the images of registry host (such
// as "registry.k8s.io") from mirror (such as "http://127.0.0.1:5000", a
// loopback registry) and nowhere else, from the next pull on. Image names
// keep their host: registry.k8s.io/pause:3.10 is fetched as
// MIRROR/v2/pause/manifests/3.10.
func (n *Node) MirrorRegistry(host, mirror string) error {
	return MirrorRegistry(n.RegistryHostsDir, host, mirror)
}

// MirrorRegistry writes hostsDir/host/hosts.toml for any containerd whose
// registry config_path is hostsDir; see Node.MirrorRegistry.
func MirrorRegistry(hostsDir, host, mirror string) error {
	dir := filepath.Join(hostsDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("localnode: mirror %s: %w", host, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hostsTOML(mirror)), 0o644); err != nil {
		return fmt.Errorf("localnode: mirror %s: %w", host, err)
	}
	return nil
}

// TagImage gives the image named source the names targets as well.
func (n *Node) TagImage(ctx context.Context, source string, targets ...string) error {
	if len(targets) == 0 {
		return nil
	}
	args := append([]string{"images", "tag", "--force", source}, targets...)
	if _, err := n.Ctr(ctx, args...); err != nil {
		return fmt.Errorf("localnode: tag image %s: %w", source, err)
	}
	return nil
}

// Ctr runs ctr against the node's containerd in the CRI namespace and
// returns its standard output.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, n.opts.Ctr, append([]string{"--address", n.Socket, "--namespace", Namespace}, args...)...)
}

// Crictl runs crictl against the node's CRI endpoint and returns its
// standard output.
func (n *Node) Crictl(ctx context.Context, args ...string) ([]byte, error) {
	ep := n.Endpoint()
	return run(ctx, n.opts.Crictl, append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "60s"}, args...)...)
}

// CrictlPath is the crictl binary the node uses.
func (n *Node) CrictlPath() string { return n.opts.Crictl }

// run runs a command and returns its standard output; its error carries
// the command's standard error.
func run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
