// Command critest runs cri-tools' CRI validation suite (critest) against a
// CRI endpoint on this machine without internet, and prints how many specs
// passed, failed and were skipped.
//
// By default it starts a local containerd (internal/localnode) and tests it
// directly. With --endpoint it tests that endpoint instead (the CRI shim's
// socket, with the shim in front of a containerd).
//
// critest pulls every image it runs. Here they are busybox images built
// from the host's busybox (localnode.WriteImageLayout), each with an image
// ID of its own, served by a loopback registry (loopback-registry, built by
// make node-binaries). Two ways to reach it:
//
//   - mirror (the default with a local containerd, or with
//     --containerd-hosts-dir for the registry config directory of the
//     containerd behind --endpoint): containerd pulls registry.k8s.io and
//     gcr.io from the loopback registry, and critest runs with its image
//     names unchanged;
//   - prefix (--endpoint alone, or --image-mode=prefix): critest's
//     --registry-prefix names the loopback registry; cri-tools 1.34 then
//     drops the tags, and some specs create containers from images named
//     unprefixed, so those are also imported into the containerd at
//     --containerd-address under their own names. The image specs check
//     unprefixed names after pulling prefixed ones and fail in this mode.
//
// busybox stands in for nginx and httpd, and the VM lacks iptables NAT and
// some kernel features, so the suite has failures that are not the
// runtime's: known-failures.txt (mirror) and known-failures-prefix.txt list
// them, and only failures not listed make the command fail.
//
//	go run ./test/critest --bin-dir _output/tools/bin --out _output/critest \
//		[--endpoint unix:///tmp/shim.sock [--containerd-hosts-dir DIR | --containerd-address SOCK]] [-- critest flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/internal/localcluster"
	"github.com/kubegpu/kubegpu/internal/localnode"
)

type options struct {
	binDir, outDir      string
	endpoint            string
	shim, shimPluginDir string
	containerdAddress   string
	containerdHostsDir  string
	imageMode           string
	knownFailures       string
	timeout             time.Duration
	keep                bool
	critestArgs         []string
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "_output/tools/bin", "directory with containerd, containerd-shim-runc-v2, ctr, crictl, critest and loopback-registry (make node-binaries)")
	flag.StringVar(&o.outDir, "out", "_output/critest", "directory for critest's log, its JUnit report and the lists of failed specs")
	flag.StringVar(&o.endpoint, "endpoint", "", "CRI endpoint to test (default: a local containerd this command starts)")
	flag.StringVar(&o.containerdHostsDir, "containerd-hosts-dir", "", "with --endpoint: the registry config_path of the containerd behind it (localnode: DIR/certs.d), for mirror mode")
	flag.StringVar(&o.containerdAddress, "containerd-address", "", "with --endpoint in prefix mode: the socket of the containerd behind it, to import the e2e images into")
	flag.StringVar(&o.imageMode, "image-mode", "auto", "how critest gets its images: mirror, prefix, or auto (mirror where the registry config directory is known)")
	flag.StringVar(&o.knownFailures, "known-failures", "", "specs expected to fail on this machine; others fail the command (default: test/critest/known-failures.txt, or known-failures-prefix.txt in prefix mode)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "limit for the whole run")
	flag.BoolVar(&o.keep, "keep", false, "keep the node's directory")
	flag.StringVar(&o.shim, "shim", "", "kubegpu-crishim binary: test through it, in front of the local containerd")
	flag.StringVar(&o.shimPluginDir, "shim-plugin-dir", "_output/plugins", "with --shim: its device modules")
	flag.Parse()
	o.critestArgs = flag.Args()

	if err := runWithSignals(o); err != nil {
		fmt.Fprintln(os.Stderr, "critest:", err)
		os.Exit(1)
	}
}

// runWithSignals runs until done, interrupted or past o.timeout; the
// node, the registry and critest are stopped in every case.
func runWithSignals(o options) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, o.timeout)
	defer cancelTimeout()
	return run(ctx, o)
}

func run(ctx context.Context, o options) error {
	for _, p := range []*string{&o.binDir, &o.outDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	for _, b := range []string{"critest", "loopback-registry"} {
		if _, err := os.Stat(filepath.Join(o.binDir, b)); err != nil {
			return fmt.Errorf("%s not found in %s: build it with make node-binaries", b, o.binDir)
		}
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kubegpu-critest-")
	if err != nil {
		return err
	}
	defer func() {
		if !o.keep {
			_ = os.RemoveAll(dir)
		}
	}()

	// The images: one OCI layout per variant.
	images := testImages()
	layouts := make([]string, len(images))
	for i, img := range images {
		layouts[i] = filepath.Join(dir, "images", fmt.Sprintf("image-%d", i))
		if err := localnode.WriteImageLayout(layouts[i], img.spec); err != nil {
			return err
		}
	}

	// The runtime under test, and how its containerd gets the images.
	endpoint, hostsDir := o.endpoint, o.containerdHostsDir
	if endpoint == "" {
		start := time.Now()
		nodeDir := filepath.Join(dir, "node")
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return err
		}
		node, err := localnode.Start(ctx, localnode.Options{Dir: nodeDir, BinDir: o.binDir})
		if err != nil {
			return err
		}
		defer func() {
			if err := node.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "critest:", err)
			}
			copyFile(node.Log, filepath.Join(o.outDir, "containerd.log"))
		}()
		endpoint, hostsDir = node.Endpoint(), node.RegistryHostsDir
		if o.containerdAddress == "" {
			o.containerdAddress = node.Socket
		}
		fmt.Printf("critest: containerd %s ready in %s (log: %s, copied to %s)\n", node.Socket,
			time.Since(start).Round(time.Millisecond), node.Log, filepath.Join(o.outDir, "containerd.log"))
		if o.shim != "" {
			sock, stop, err := startShim(ctx, o, nodeDir, node.Endpoint())
			if err != nil {
				return err
			}
			defer stop()
			endpoint = "unix://" + sock
		}
	}
	var prefixMode bool
	switch o.imageMode {
	case "auto":
		prefixMode = hostsDir == ""
	case "prefix":
		prefixMode = true
	case "mirror":
		if hostsDir == "" {
			return errors.New("--image-mode=mirror with --endpoint needs --containerd-hosts-dir")
		}
	default:
		return fmt.Errorf("--image-mode %q: want auto, mirror or prefix", o.imageMode)
	}
	if o.knownFailures == "" {
		o.knownFailures = "test/critest/known-failures.txt"
		if prefixMode {
			o.knownFailures = "test/critest/known-failures-prefix.txt"
		}
	}
	if o.knownFailures, err = filepath.Abs(o.knownFailures); err != nil {
		return err
	}

	registry, addr, err := startRegistry(ctx, o, dir, images, layouts, prefixMode)
	if err != nil {
		return err
	}
	defer func() { _ = registry.Stop() }()
	var imageArgs []string
	if prefixMode {
		fmt.Printf("critest: prefix mode: critest pulls from %s\n", addr)
		imageArgs = []string{"--registry-prefix=" + addr}
		if o.containerdAddress == "" {
			fmt.Println("critest: no --containerd-address: the e2e images are not imported; specs that use them unprefixed fail")
		} else if err := importImages(ctx, filepath.Join(o.binDir, "ctr"), o.containerdAddress, dir, images); err != nil {
			return err
		}
	} else {
		fmt.Printf("critest: mirror mode: containerd pulls %s from %s\n", strings.Join(mirroredRegistries, " and "), addr)
		for _, r := range mirroredRegistries {
			if err := localnode.MirrorRegistry(hostsDir, r, "http://"+addr); err != nil {
				return err
			}
		}
	}

	report := filepath.Join(o.outDir, "junit.xml")
	logPath := filepath.Join(o.outDir, "critest.log")
	_ = os.Remove(report)
	args := append([]string{
		"--runtime-endpoint=" + endpoint, "--image-endpoint=" + endpoint,
		"--ginkgo.junit-report=" + report, "--ginkgo.no-color",
	}, imageArgs...)
	args = append(args, o.critestArgs...)
	fmt.Printf("critest: running critest against %s (log: %s); about 2 minutes\n", endpoint, logPath)
	start := time.Now()
	critestErr := runLogged(ctx, filepath.Join(dir, "work"), logPath, filepath.Join(o.binDir, "critest"), args...)
	elapsed := time.Since(start).Round(time.Second)

	res, err := readJUnit(report)
	if err != nil {
		if critestErr != nil {
			return fmt.Errorf("critest failed without a report (%w); see %s", critestErr, logPath)
		}
		return fmt.Errorf("read critest's report: %w; see %s", err, logPath)
	}
	known, err := readKnownFailures(o.knownFailures)
	if err != nil {
		return err
	}
	var unexpected, fixed []string
	for _, f := range res.failed {
		if !known[f] {
			unexpected = append(unexpected, f)
		}
	}
	failed := map[string]bool{}
	for _, f := range res.failed {
		failed[f] = true
	}
	for k := range known {
		if !failed[k] && res.ran[k] {
			fixed = append(fixed, k)
		}
	}
	sort.Strings(fixed)
	if err := os.WriteFile(filepath.Join(o.outDir, "failed.txt"), []byte(strings.Join(res.failed, "\n")+"\n"), 0o644); err != nil {
		return err
	}

	fmt.Printf("critest: %d passed, %d failed, %d skipped in %s against %s\n", len(res.passed), len(res.failed), res.skipped, elapsed, endpoint)
	fmt.Printf("critest: %d of the failures are known (%s), %d are not\n", len(res.failed)-len(unexpected), o.knownFailures, len(unexpected))
	for _, f := range unexpected {
		fmt.Println("  UNEXPECTED FAILURE:", f)
	}
	for _, f := range fixed {
		fmt.Println("  known failure now passes:", f)
	}
	fmt.Printf("critest: failed specs listed in %s; JUnit report %s\n", filepath.Join(o.outDir, "failed.txt"), report)
	if len(unexpected) > 0 {
		return fmt.Errorf("%d unexpected failures; see %s", len(unexpected), logPath)
	}
	return nil
}

// runLogged runs a command in dir with its output both on stdout and in
// logPath.
func runLogged(ctx context.Context, dir, logPath, bin string, args ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Stdout = io.MultiWriter(f, os.Stdout)
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd.Run()
}

func copyFile(from, to string) {
	data, err := os.ReadFile(from)
	if err == nil {
		_ = os.WriteFile(to, data, 0o644)
	}
}

// startShim runs kubegpu-crishim in front of the runtime at backend, with
// simulated GPUs, and returns its socket.
func startShim(ctx context.Context, o options, dir, backend string) (string, func(), error) {
	_, key, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "crishim.sock")
	log := filepath.Join(o.outDir, "kubegpu-crishim.log")
	p, err := localcluster.StartProcess(log, o.shim, "--node-name=critest", "--plugin-dir="+o.shimPluginDir,
		"--plugin-option=simgpu.preset=t4x4", "--listen="+sock, "--runtime-endpoint="+backend,
		"--allocation-key="+key, "--advertise=false")
	if err != nil {
		return "", nil, err
	}
	stop := func() { _ = p.Stop() }
	if err := p.WaitFor(ctx, 30*time.Second, func(context.Context) error { _, err := os.Stat(sock); return err }); err != nil {
		stop()
		return "", nil, err
	}
	fmt.Printf("critest: kubegpu-crishim %s in front of %s (log: %s)\n", sock, backend, log)
	return sock, stop, nil
}
