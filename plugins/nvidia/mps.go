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
	// Started is the daemon's start time in clock ticks since boot
	// (/proc/PID/stat field 22): with the PID, it names the process.
	Started uint64 `json:"started"`
}

// Sizes of the tmpfs mounted on each container's MPS directories: they are
// the container's /dev/shm and its pipe directory, and must not fill the
// host's /run.
const (
	DefaultMPSShmMiB = 64 // containerd's default /dev/shm size
	mpsPipeBytes     = 1 << 20
	mpsLogBytes      = 4 << 20
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
// the container's directory, which tenants cannot reach, finds it again,
// and restore sets its limits anew. A container that restarts gets a new
// daemon.
type mpsDaemons struct {
	root     string
	control  string // resolved path
	unshare  string // resolved path
	shmBytes int

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
	return &mpsDaemons{root: c.mpsRoot, control: control, unshare: unshare, shmBytes: c.mpsShmMiB << 20}, nil
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
		// A restart of the container gets a daemon started afresh: what
		// the last one's clients did to its limits through the pipe
		// (its defaults, its servers') does not carry over.
		m.stop(ctx, dir, have)
	}
	if err := m.prepare(d); err != nil {
		return mpsDirs{}, err
	}
	r, err := m.start(ctx, d, want)
	if err != nil {
		return mpsDirs{}, err
	}
	if err := m.setPinned(ctx, d.pipe, limits); err != nil {
		m.stop(ctx, dir, r)
		return mpsDirs{}, err
	}
	klog.FromContext(ctx).Info("Started an MPS daemon for the container", "podUID", podUID, "container", container,
		"gpus", want.GPUs, "threadPercent", limits.ThreadPercent, "pinnedMemory", limits.PinnedMemory, "pid", r.PID)
	return d, nil
}

// restore sets, through their pipes, the limits of the daemons already
// running when the shim starts (started by an earlier shim, which may have
// set the memory limit in the environment alone, where it cannot be read
// back). A daemon that does not answer is left to the checker.
func (m *mpsDaemons) restore(ctx context.Context) {
	logger := klog.FromContext(ctx)
	pods, _ := os.ReadDir(m.root)
	for _, pod := range pods {
		if strings.HasPrefix(pod.Name(), tombstonePrefix) || !pod.IsDir() {
			continue
		}
		containers, _ := os.ReadDir(filepath.Join(m.root, pod.Name()))
		for _, c := range containers {
			dir := filepath.Join(m.root, pod.Name(), c.Name())
			r, ok := readRecord(dir)
			if !ok || !m.alive(r) {
				continue
			}
			pipe := filepath.Join(dir, "pipe")
			if _, err := m.query(ctx, pipe, fmt.Sprintf("%s %d", mpsSetThreads, r.Limits.ThreadPercent)); err != nil {
				logger.Error(err, "Cannot set a running MPS daemon's limits again", "dir", dir)
				continue
			}
			if err := m.setPinned(ctx, pipe, r.Limits); err != nil {
				logger.Error(err, "Cannot set a running MPS daemon's limits again", "dir", dir)
			}
		}
	}
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
	}{{d.pipe, mpsPipeBytes}, {d.shm, m.shmBytes}, {d.log, mpsLogBytes}} {
		_ = syscall.Unmount(t.dir, syscall.MNT_DETACH) // a mount left by a daemon that died
		if err := syscall.Mount("tmpfs", t.dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC,
			fmt.Sprintf("size=%d,mode=1777", t.bytes)); err != nil {
			return fmt.Errorf("mount a tmpfs on MPS directory %s: %w", t.dir, err)
		}
	}
	return nil
}

// start starts the daemon in the foreground, as a child in its own
// process group, in a mount namespace whose /dev/shm is the container's,
// and records it in the container's directory at once.
func (m *mpsDaemons) start(ctx context.Context, d mpsDirs, r mpsRecord) (mpsRecord, error) {
	logger := klog.FromContext(ctx)
	logPath := filepath.Join(d.log, "control.stderr")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return r, fmt.Errorf("MPS daemon log: %w", err)
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
		return r, fmt.Errorf("start the container's MPS daemon: %w", err)
	}
	r.PID = cmd.Process.Pid
	r.Started, _ = startTime(r.PID)
	dir := filepath.Dir(d.pipe)
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait() // reaps it whenever it ends
		exited <- err
		logger.Info("MPS daemon exited", "dir", dir, "pid", r.PID, "err", err)
	}()
	kill := func(cause error) (mpsRecord, error) {
		_ = syscall.Kill(-r.PID, syscall.SIGKILL)
		_ = os.Remove(filepath.Join(dir, mpsMarker))
		return r, cause
	}
	b, _ := json.Marshal(r)
	if err := os.WriteFile(filepath.Join(dir, mpsMarker), b, 0o600); err != nil {
		return kill(fmt.Errorf("MPS record: %w", err))
	}
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
			return kill(fmt.Errorf("the container's MPS daemon (%s -f) exited at start: %w: %s", m.control, err, bytes.TrimSpace(lastBytes(tail, 512))))
		case <-ctx.Done():
			return kill(ctx.Err())
		case <-deadline.C:
			// Running, but no pipe yet: let the container start; its
			// clients retry.
			logger.Info("MPS daemon made no pipe yet", "dir", d.pipe, "pid", r.PID)
			return r, nil
		case <-tick.C:
			if entries, _ := os.ReadDir(d.pipe); len(entries) > 0 {
				return r, nil
			}
		}
	}
}

// release stops the daemons of pods not in live and removes their
// directories; pods whose directories were made after listed (when live was
// listed, so their sandboxes may be missing from it) are kept. Under the
// lock a released pod's directory is renamed out of ensure's way, so that a
// container of the same pod started meanwhile gets a directory of its own.
func (m *mpsDaemons) release(ctx context.Context, live map[string]bool, listed time.Time) error {
	m.mu.Lock()
	pods, err := os.ReadDir(m.root)
	var gone, stale []string
	for _, pod := range pods {
		if strings.HasPrefix(pod.Name(), tombstonePrefix) {
			stale = append(stale, filepath.Join(m.root, pod.Name())) // a release cut short
			continue
		}
		if !pod.IsDir() || live[pod.Name()] {
			continue
		}
		// File times are coarser than the clock: a second of slack.
		if fi, err := pod.Info(); err != nil || !fi.ModTime().Before(listed.Add(-time.Second)) {
			continue
		}
		tomb := filepath.Join(m.root, fmt.Sprintf("%s%s-%d", tombstonePrefix, pod.Name(), time.Now().UnixNano()))
		if err := os.Rename(filepath.Join(m.root, pod.Name()), tomb); err != nil {
			klog.FromContext(ctx).Error(err, "Releasing the MPS directories of a pod that is gone", "podUID", pod.Name())
			continue
		}
		gone = append(gone, tomb)
	}
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("MPS root: %w", err)
	}
	var errs []error
	for _, tomb := range append(stale, gone...) {
		containers, _ := os.ReadDir(tomb)
		for _, c := range containers {
			dir := filepath.Join(tomb, c.Name())
			if r, ok := readRecord(dir); ok {
				m.stop(ctx, dir, r)
			}
			for _, sub := range []string{"pipe", "shm", "log"} {
				_ = syscall.Unmount(filepath.Join(dir, sub), syscall.MNT_DETACH)
			}
		}
		if err := os.RemoveAll(tomb); err != nil {
			errs = append(errs, fmt.Errorf("remove MPS directories %s: %w", tomb, err))
			continue
		}
		klog.FromContext(ctx).Info("Stopped the MPS daemons of a pod that is gone", "dir", tomb)
	}
	return errors.Join(errs...)
}

// tombstonePrefix names the directories of pods being released; no pod
// UID starts with a dot.
const tombstonePrefix = ".released-"

// stop ends a container's daemon: its process group, by the PID and start
// time recorded where tenants cannot reach (never through its pipe
// directory, which they can).
func (m *mpsDaemons) stop(ctx context.Context, dir string, r mpsRecord) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !m.alive(r) {
			break
		}
		_ = syscall.Kill(-r.PID, sig)
		for end := time.Now().Add(mpsQuitTimeout); m.alive(r) && time.Now().Before(end); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if m.alive(r) {
		klog.FromContext(ctx).Error(nil, "MPS daemon does not stop", "dir", dir, "pid", r.PID)
	}
	_ = os.Remove(filepath.Join(dir, mpsMarker))
}

// alive reports whether the recorded daemon still runs: the process with
// its PID and start time, not a zombie.
func (m *mpsDaemons) alive(r mpsRecord) bool {
	if r.PID <= 0 || r.Started == 0 {
		return false
	}
	started, ok := startTime(r.PID)
	return ok && started == r.Started
}

// startTime reads a live (not zombie) process's start time from
// /proc/PID/stat.
func startTime(pid int) (uint64, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	// Fields after the command: state is field 3, start time field 22.
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return 0, false
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	return v, err == nil
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
