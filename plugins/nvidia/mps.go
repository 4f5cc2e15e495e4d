package nvidia

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// mpsDirs are one container's MPS directories on the host.
type mpsDirs struct {
	pipe, shm, log string
}

// mpsMarker, in a container's MPS directory, lists the GPUs its daemon
// serves: the daemon was started.
const mpsMarker = "kubegpu-mps-devices"

// mpsTimeout bounds starting or stopping one daemon.
const mpsTimeout = 10 * time.Second

// safeName is what a pod UID or container name must look like to name a
// directory.
var safeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// mpsDaemons starts an MPS control daemon per container with slices, in
// root/POD-UID/CONTAINER/{pipe,shm,log}: its own pipe directory, and its
// own /dev/shm (the daemon runs in a mount namespace of its own, with that
// directory bound on /dev/shm). root is root's alone (0700); a container
// sees only its own directories, bound into it. The daemons outlive the
// shim (they are daemons): a restarted shim finds them by their markers.
type mpsDaemons struct {
	root    string
	control string // resolved path
	unshare string // resolved path

	mu sync.Mutex // serializes starts and stops
}

// newMPSDaemons checks the configuration: the control binary and unshare
// must exist, and root is made (or must be) a directory only root can
// enter.
func newMPSDaemons(c config) (*mpsDaemons, error) {
	control, err := exec.LookPath(c.mpsControl)
	if err != nil {
		return nil, fmt.Errorf("MPS control binary %q: %w (set %s.%s to its path)", c.mpsControl, err, Name, OptionMPSControl)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return nil, fmt.Errorf("MPS needs unshare (util-linux) to give each daemon its own /dev/shm: %w", err)
	}
	if err := os.MkdirAll(c.mpsRoot, 0o700); err != nil {
		return nil, fmt.Errorf("MPS root %s: %w", c.mpsRoot, err)
	}
	fi, err := os.Lstat(c.mpsRoot)
	if err != nil {
		return nil, fmt.Errorf("MPS root %s: %w", c.mpsRoot, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return nil, fmt.Errorf("MPS root %s is not a directory (a symbolic link?)", c.mpsRoot)
	case !ok || (st.Uid != 0 && st.Uid != uint32(os.Geteuid())):
		return nil, fmt.Errorf("MPS root %s is not owned by root: chown root %s", c.mpsRoot, c.mpsRoot)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(c.mpsRoot, 0o700); err != nil {
			return nil, fmt.Errorf("MPS root %s: %w", c.mpsRoot, err)
		}
	}
	return &mpsDaemons{root: c.mpsRoot, control: control, unshare: unshare}, nil
}

func (m *mpsDaemons) dirs(podUID, container string) mpsDirs {
	dir := filepath.Join(m.root, podUID, container)
	return mpsDirs{pipe: filepath.Join(dir, "pipe"), shm: filepath.Join(dir, "shm"), log: filepath.Join(dir, "log")}
}

// ensure makes sure a daemon serves uuids for the container and returns
// its directories.
func (m *mpsDaemons) ensure(ctx context.Context, podUID, container string, uuids []string) (mpsDirs, error) {
	if m == nil {
		return mpsDirs{}, errors.New("MPS is not enabled on this node")
	}
	if !safeName.MatchString(podUID) || !safeName.MatchString(container) {
		return mpsDirs{}, fmt.Errorf("pod UID %q or container name %q cannot name an MPS directory", podUID, container)
	}
	d := m.dirs(podUID, container)
	dir := filepath.Dir(d.pipe)
	want := strings.Join(uuids, ",")
	m.mu.Lock()
	defer m.mu.Unlock()
	switch have, err := os.ReadFile(filepath.Join(dir, mpsMarker)); {
	case err == nil && string(have) == want:
		return d, nil // a restart of the container
	case err == nil:
		// The same container name with other GPUs cannot happen within
		// one pod; start afresh.
		m.stop(ctx, dir)
	}
	for _, p := range []string{filepath.Dir(dir), dir, d.log} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return mpsDirs{}, fmt.Errorf("MPS directory: %w", err)
		}
	}
	// The container's processes (any user) talk to the daemon in these;
	// no one else can reach them under the 0700 root.
	for _, p := range []string{d.pipe, d.shm} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return mpsDirs{}, fmt.Errorf("MPS directory: %w", err)
		}
		if err := os.Chmod(p, 0o1777); err != nil {
			return mpsDirs{}, fmt.Errorf("MPS directory: %w", err)
		}
	}
	logFile, err := os.OpenFile(filepath.Join(d.log, "kubegpu-start.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return mpsDirs{}, fmt.Errorf("MPS start log: %w", err)
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(ctx, mpsTimeout)
	defer cancel()
	// A mount namespace of its own, whose /dev/shm is the container's
	// shm directory; the daemon (and the MPS server it starts) keep it.
	cmd := exec.CommandContext(ctx, m.unshare, "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", `mount --bind "$1" /dev/shm && exec "$2" -d`, "kubegpu-mps", d.shm, m.control)
	cmd.Env = append(os.Environ(),
		"CUDA_MPS_PIPE_DIRECTORY="+d.pipe,
		"CUDA_MPS_LOG_DIRECTORY="+d.log,
		"CUDA_VISIBLE_DEVICES="+want)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return mpsDirs{}, fmt.Errorf("start the container's MPS daemon (%s -d; log in %s): %w", m.control, d.log, err)
	}
	if err := os.WriteFile(filepath.Join(dir, mpsMarker), []byte(want), 0o600); err != nil {
		return mpsDirs{}, fmt.Errorf("MPS marker: %w", err)
	}
	klog.FromContext(ctx).Info("Started an MPS daemon for the container", "podUID", podUID, "container", container, "gpus", want, "dir", dir)
	return d, nil
}

// release stops the daemons of pods not in live and removes their
// directories.
func (m *mpsDaemons) release(ctx context.Context, live map[string]bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	pods, err := os.ReadDir(m.root)
	if err != nil {
		return fmt.Errorf("MPS root: %w", err)
	}
	var errs []error
	for _, pod := range pods {
		if !pod.IsDir() || live[pod.Name()] {
			continue
		}
		podDir := filepath.Join(m.root, pod.Name())
		containers, _ := os.ReadDir(podDir)
		for _, c := range containers {
			if c.IsDir() {
				m.stop(ctx, filepath.Join(podDir, c.Name()))
			}
		}
		if err := os.RemoveAll(podDir); err != nil {
			errs = append(errs, fmt.Errorf("remove MPS directories of pod %s: %w", pod.Name(), err))
			continue
		}
		klog.FromContext(ctx).Info("Stopped the MPS daemons of a pod that is gone", "podUID", pod.Name())
	}
	return errors.Join(errs...)
}

// stop asks the daemon of a container's directory to quit. Called with
// mu held.
func (m *mpsDaemons) stop(ctx context.Context, dir string) {
	if _, err := os.Stat(filepath.Join(dir, mpsMarker)); errors.Is(err, fs.ErrNotExist) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, mpsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.control)
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(dir, "pipe"))
	cmd.Stdin = strings.NewReader("quit\n")
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		klog.FromContext(ctx).Error(err, "Stopping an MPS daemon", "dir", dir, "output", string(out))
	}
	_ = os.Remove(filepath.Join(dir, mpsMarker))
}
