package nvidia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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

// mpsLimits are what the container's daemon gives every client: its
// defaults, which a client's own settings can only lower.
type mpsLimits struct {
	// ThreadPercent is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
	ThreadPercent int `json:"threadPercent"`
	// PinnedMemory is CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=1024M,1=2048M"),
	// or empty.
	PinnedMemory string `json:"pinnedMemory,omitempty"`
}

// mpsMarker, in a container's MPS directory (root's alone), records the
// daemon started for it.
const mpsMarker = "kubegpu-mps.json"

type mpsRecord struct {
	GPUs   string    `json:"gpus"`
	Limits mpsLimits `json:"limits"`
	PID    int       `json:"pid"`
}

// Sizes of the tmpfs mounted on each container's MPS directories: they are
// the container's /dev/shm and its pipe directory, and must not fill the
// host's /run.
const (
	MPSShmBytes  = 64 << 20 // containerd's default /dev/shm size
	mpsPipeBytes = 1 << 20
)

// Timeouts of a daemon's start and stop.
const (
	mpsStartTimeout = 5 * time.Second
	mpsQuitTimeout  = 2 * time.Second
)

// safeName is what a pod UID or container name must look like to name a
// directory.
var safeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// mpsDaemons runs an MPS control daemon per container with slices, in
// root/POD-UID/CONTAINER/: its own pipe directory and /dev/shm (tmpfs of
// bounded size; the daemon runs in a mount namespace of its own with that
// shm on /dev/shm), and its limits as the daemon's defaults. root is
// root's alone (0700); a container sees only its own directories, bound
// into it. A daemon is a child of the shim in its own process group, and
// outlives a shim restart (the unit's KillMode=process): the record in
// the container's directory, which tenants cannot reach, finds it again.
type mpsDaemons struct {
	root    string
	control string // resolved path
	unshare string // resolved path

	mu sync.Mutex // serializes starts; release picks its pods under it
}

// newMPSDaemons checks the configuration: the control binary and unshare
// must exist, and root is made (or must be) a directory only root can
// enter.
func newMPSDaemons(c config) (*mpsDaemons, error) {
	control, err := exec.LookPath(c.mpsControl)
	if err != nil {
		return nil, fmt.Errorf("MPS control binary %q: %w (set %s.%s to its path)", c.mpsControl, err, Name, OptionMPSControl)
	}
	if control, err = filepath.Abs(control); err != nil {
		return nil, fmt.Errorf("MPS control binary: %w", err)
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

// ensure makes sure a daemon serves gpus with limits for the container and
// returns its directories.
func (m *mpsDaemons) ensure(ctx context.Context, podUID, container string, gpus []string, limits mpsLimits) (mpsDirs, error) {
	if m == nil {
		return mpsDirs{}, errors.New("MPS is not enabled on this node")
	}
	if !safeName.MatchString(podUID) || !safeName.MatchString(container) {
		return mpsDirs{}, fmt.Errorf("pod UID %q or container name %q cannot name an MPS directory", podUID, container)
	}
	d := m.dirs(podUID, container)
	dir := filepath.Dir(d.pipe)
	want := mpsRecord{GPUs: strings.Join(gpus, ","), Limits: limits}
	m.mu.Lock()
	defer m.mu.Unlock()
	if have, ok := readRecord(dir); ok {
		if have.GPUs == want.GPUs && have.Limits == want.Limits && m.alive(have.PID) {
			return d, nil // a restart of the container
		}
		// The daemon died, or (impossible within one pod) the container
		// name has other GPUs: start afresh.
		m.stop(ctx, dir, have)
	}
	if err := m.prepare(d); err != nil {
		return mpsDirs{}, err
	}
	pid, err := m.start(ctx, d, want)
	if err != nil {
		return mpsDirs{}, err
	}
	want.PID = pid
	b, _ := json.Marshal(want)
	if err := os.WriteFile(filepath.Join(dir, mpsMarker), b, 0o600); err != nil {
		return mpsDirs{}, fmt.Errorf("MPS record: %w", err)
	}
	klog.FromContext(ctx).Info("Started an MPS daemon for the container", "podUID", podUID, "container", container,
		"gpus", want.GPUs, "threadPercent", limits.ThreadPercent, "pinnedMemory", limits.PinnedMemory, "pid", pid)
	return d, nil
}

// prepare makes the container's directories: the pipe directory and shm
// are size-bounded tmpfs that any user of the container may write.
func (m *mpsDaemons) prepare(d mpsDirs) error {
	for _, p := range []string{filepath.Dir(filepath.Dir(d.pipe)), filepath.Dir(d.pipe), d.log, d.pipe, d.shm} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return fmt.Errorf("MPS directory: %w", err)
		}
	}
	for _, t := range []struct {
		dir   string
		bytes int
	}{{d.pipe, mpsPipeBytes}, {d.shm, MPSShmBytes}} {
		_ = syscall.Unmount(t.dir, syscall.MNT_DETACH) // a mount left by a daemon that died
		if err := syscall.Mount("tmpfs", t.dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC,
			fmt.Sprintf("size=%d,mode=1777", t.bytes)); err != nil {
			return fmt.Errorf("mount a tmpfs on MPS directory %s: %w", t.dir, err)
		}
	}
	return nil
}

// start starts the daemon in the foreground, as a child in its own
// process group, in a mount namespace whose /dev/shm is the container's.
func (m *mpsDaemons) start(ctx context.Context, d mpsDirs, r mpsRecord) (int, error) {
	logPath := filepath.Join(d.log, "control.stderr")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("MPS daemon log: %w", err)
	}
	defer logFile.Close()
	// Slave propagation: unmounts on the host (other pods' volumes)
	// reach the daemon's namespace, so it pins none of them.
	cmd := exec.Command(m.unshare, "--mount", "--propagation", "slave", "--",
		"/bin/sh", "-c", `mount --bind "$1" /dev/shm && exec "$2" -f`, "kubegpu-mps", d.shm, m.control)
	cmd.Env = append(os.Environ(),
		"CUDA_MPS_PIPE_DIRECTORY="+d.pipe,
		"CUDA_MPS_LOG_DIRECTORY="+d.log,
		"CUDA_VISIBLE_DEVICES="+r.GPUs,
		"CUDA_DEVICE_ORDER=PCI_BUS_ID",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(r.Limits.ThreadPercent))
	if r.Limits.PinnedMemory != "" {
		cmd.Env = append(cmd.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+r.Limits.PinnedMemory)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the container's MPS daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it whenever it ends
	deadline := time.NewTimer(mpsStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("exit status 0")
			}
			tail, _ := os.ReadFile(logPath)
			return 0, fmt.Errorf("the container's MPS daemon (%s -f) exited at start: %w: %s", m.control, err, bytes.TrimSpace(lastBytes(tail, 512)))
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return 0, ctx.Err()
		case <-deadline.C:
			// Running, but no pipe yet: let the container start; its
			// clients retry.
			klog.FromContext(ctx).Info("MPS daemon made no pipe yet", "dir", d.pipe, "pid", cmd.Process.Pid)
			return cmd.Process.Pid, nil
		case <-tick.C:
			if entries, _ := os.ReadDir(d.pipe); len(entries) > 0 {
				return cmd.Process.Pid, nil
			}
		}
	}
}

// release stops the daemons of pods not in live and removes their
// directories; pods whose directories were made after listed (when live was
// listed, so their sandboxes may be missing from it) are kept.
func (m *mpsDaemons) release(ctx context.Context, live map[string]bool, listed time.Time) error {
	m.mu.Lock()
	pods, err := os.ReadDir(m.root)
	var gone []string
	for _, pod := range pods {
		if !pod.IsDir() || live[pod.Name()] {
			continue
		}
		// File times are coarser than the clock: a second of slack.
		if fi, err := pod.Info(); err != nil || !fi.ModTime().Before(listed.Add(-time.Second)) {
			continue
		}
		gone = append(gone, filepath.Join(m.root, pod.Name()))
	}
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("MPS root: %w", err)
	}
	var errs []error
	for _, podDir := range gone {
		containers, _ := os.ReadDir(podDir)
		for _, c := range containers {
			dir := filepath.Join(podDir, c.Name())
			if r, ok := readRecord(dir); ok {
				m.stop(ctx, dir, r)
			}
			for _, sub := range []string{"pipe", "shm"} {
				_ = syscall.Unmount(filepath.Join(dir, sub), syscall.MNT_DETACH)
			}
		}
		if err := os.RemoveAll(podDir); err != nil {
			errs = append(errs, fmt.Errorf("remove MPS directories of pod %s: %w", filepath.Base(podDir), err))
			continue
		}
		klog.FromContext(ctx).Info("Stopped the MPS daemons of a pod that is gone", "podUID", filepath.Base(podDir))
	}
	return errors.Join(errs...)
}

// stop asks a container's daemon to quit through its pipe, and ends its
// process group if it has not within mpsQuitTimeout (a tenant can tamper
// with its pipe directory, never with the record).
func (m *mpsDaemons) stop(ctx context.Context, dir string, r mpsRecord) {
	logger := klog.FromContext(ctx)
	if m.alive(r.PID) {
		quitCtx, cancel := context.WithTimeout(ctx, mpsQuitTimeout)
		cmd := exec.CommandContext(quitCtx, m.control)
		cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(dir, "pipe"))
		cmd.Stdin = strings.NewReader("quit\n")
		cmd.WaitDelay = 100 * time.Millisecond
		if out, err := cmd.CombinedOutput(); err != nil {
			logger.V(2).Info("MPS daemon did not take quit", "dir", dir, "err", err, "output", string(out))
		}
		cancel()
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			if !m.alive(r.PID) {
				break
			}
			_ = syscall.Kill(-r.PID, sig)
			for end := time.Now().Add(mpsQuitTimeout); m.alive(r.PID) && time.Now().Before(end); {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if m.alive(r.PID) {
			logger.Error(nil, "MPS daemon does not stop", "dir", dir, "pid", r.PID)
		}
	}
	_ = os.Remove(filepath.Join(dir, mpsMarker))
}

// alive reports whether pid is a running daemon of this control binary
// (not a reused PID, not a zombie).
func (m *mpsDaemons) alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	return bytes.Contains(cmdline, []byte(filepath.Base(m.control)))
}

func readRecord(dir string) (mpsRecord, bool) {
	b, err := os.ReadFile(filepath.Join(dir, mpsMarker))
	if err != nil {
		return mpsRecord{}, false
	}
	var r mpsRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return mpsRecord{}, false
	}
	return r, true
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
