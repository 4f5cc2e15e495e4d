package nvidia

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/types"
)

// What a container's MPS daemon is asked through its control pipe. The
// control daemon passes CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from its
// environment to the servers it starts but does not report it (driver 580
// answers get_default_device_pinned_mem_limit with nothing): the limits
// are set through the pipe as well, which it reports ("4G", "2048M").
const (
	mpsSetPinned         = "set_default_device_pinned_mem_limit"
	mpsGetPinned         = "get_default_device_pinned_mem_limit"
	mpsGetThreads        = "get_default_active_thread_percentage"
	mpsSetThreads        = "set_default_active_thread_percentage"
	mpsServerList        = "get_server_list"
	mpsGetServerThreads  = "get_active_thread_percentage"
	mpsGetServerPinned   = "get_device_pinned_mem_limit"
	mpsQueryTimeout      = 5 * time.Second
	maxMPSServersChecked = 16
)

// query sends one command to the daemon whose pipe directory is pipe and
// returns its answer. The directory is the node's: the container has it
// read-only, so the socket answering is the daemon's.
func (m *mpsDaemons) query(ctx context.Context, pipe, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, mpsQueryTimeout)
	defer cancel()
	q := exec.CommandContext(ctx, m.control)
	q.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipe)
	q.Stdin = strings.NewReader(cmd + "\n")
	q.WaitDelay = time.Second // a child left holding its output cannot hold the read-back
	out, err := q.CombinedOutput()
	answer := strings.TrimSpace(string(lastBytes(out, 4096)))
	if err != nil {
		return "", fmt.Errorf("MPS control %q: %w: %s", cmd, err, answer)
	}
	return answer, nil
}

// setPinned sets each device's pinned memory limit as the daemon's
// default, retrying while the daemon is still starting.
func (m *mpsDaemons) setPinned(ctx context.Context, pipe string, limits mpsLimits) error {
	pinned, err := parsePinned(limits.PinnedMemory)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(mpsStartTimeout)
	for ordinal, mib := range pinned {
		if mib == 0 {
			continue
		}
		cmd := fmt.Sprintf("%s %d %dM", mpsSetPinned, ordinal, mib)
		for {
			_, err := m.query(ctx, pipe, cmd)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("set the container's MPS memory limit: %w", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// applied reads back what the daemon applies to a container's clients on
// its devices (ordinals 0..devices-1): its defaults, and the settings of
// every server it runs (a client with access to the pipe may have changed
// either). Each value is the most permissive reported: the highest thread
// percentage (100 where none is set), and per device the highest memory
// limit, 0 if any is unlimited.
func (m *mpsDaemons) applied(ctx context.Context, pipe string, devices int) (threads int, mem []memLimit, err error) {
	t, err := m.query(ctx, pipe, mpsGetThreads)
	if err != nil {
		return 0, nil, err
	}
	if threads, err = parseThreads(t); err != nil {
		return 0, nil, err
	}
	mem = make([]memLimit, devices)
	for i := range mem {
		v, err := m.query(ctx, pipe, fmt.Sprintf("%s %d", mpsGetPinned, i))
		if err != nil {
			return 0, nil, err
		}
		if mem[i], err = parseMemoryLimit(v); err != nil {
			return 0, nil, err
		}
	}
	list, err := m.query(ctx, pipe, mpsServerList)
	if err != nil {
		return 0, nil, err
	}
	servers := strings.Fields(list)
	if len(servers) > maxMPSServersChecked {
		return 0, nil, fmt.Errorf("the container's MPS daemon runs %d servers, at most %d are checked", len(servers), maxMPSServersChecked)
	}
	for _, pid := range servers {
		if _, err := strconv.Atoi(pid); err != nil {
			return 0, nil, fmt.Errorf("MPS server list %q: not PIDs", abbreviate(list))
		}
		v, err := m.query(ctx, pipe, mpsGetServerThreads+" "+pid)
		if err != nil {
			return 0, nil, err
		}
		st, err := parseThreads(v)
		if err != nil {
			return 0, nil, err
		}
		threads = max(threads, st)
		for i := range mem {
			v, err := m.query(ctx, pipe, fmt.Sprintf("%s %s %d", mpsGetServerPinned, pid, i))
			if err != nil {
				return 0, nil, err
			}
			sm, err := parseMemoryLimit(v)
			if err != nil {
				return 0, nil, err
			}
			if sm.mib == 0 || mem[i].mib == 0 {
				mem[i] = memLimit{}
			} else if sm.mib+sm.unit > mem[i].mib+mem[i].unit {
				mem[i] = sm
			}
		}
	}
	return threads, mem, nil
}

// Enforced reads back, from the container's own MPS daemon, the limits its
// clients get on each device of alloc, and lists the pod's processes that
// use those GPUs without MPS (see escapes).
func (n *node) Enforced(ctx context.Context, podUID string, alloc types.ContainerAllocation) (types.Enforcement, error) {
	if n.mps == nil {
		return types.Enforcement{}, errors.New("MPS is not enabled on this node")
	}
	if !safeName.MatchString(podUID) || !safeName.MatchString(alloc.Name) {
		return types.Enforcement{}, fmt.Errorf("pod UID %q or container name %q cannot name an MPS directory", podUID, alloc.Name)
	}
	d := n.mps.dirs(podUID, alloc.Name)
	r, ok := readRecord(filepath.Dir(d.pipe))
	switch {
	case !ok:
		return types.Enforcement{}, errors.New("the container has no MPS daemon")
	case !n.mps.alive(r):
		return types.Enforcement{}, fmt.Errorf("the container's MPS daemon (PID %d) is not running", r.PID)
	}
	gpus := strings.Split(r.GPUs, ",")
	e := types.Enforcement{Mechanism: types.EnforcerMPS, MemoryMiB: make([]int64, len(alloc.Devices))}
	threads, mem, err := n.mps.applied(ctx, d.pipe, len(gpus))
	if err != nil {
		return types.Enforcement{}, err
	}
	e.ComputePercent = threads
	if threads >= types.MaxComputePercent {
		e.ComputePercent = 0 // the whole GPU: no limit
	}
	for i, s := range alloc.Devices {
		ordinal := slices.Index(gpus, s.UUID)
		if ordinal < 0 {
			return types.Enforcement{}, fmt.Errorf("the container's MPS daemon serves %s, not its GPU %s", r.GPUs, s.UUID)
		}
		// Exact to the daemon's printed precision: a limit that reads
		// as the grant's whole GiB is taken as the grant.
		e.MemoryMiB[i] = mem[ordinal].mib
		if mem[ordinal].mib > 0 && mem[ordinal].holds(s.MemoryMiB) {
			e.MemoryMiB[i] = s.MemoryMiB
		}
	}
	e.Escapes, e.EscapesUnknown = n.escapes(podUID, gpus)
	return e, nil
}

// parseThreads reads an active thread percentage as the daemon prints it
// ("25.0"), rounded; an empty answer is no limit (100).
func parseThreads(s string) (int, error) {
	if s == "" {
		return types.MaxComputePercent, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0 && f <= 100) { // NaN fails both
		return 0, fmt.Errorf("MPS active thread percentage %q: want a number 0..100", abbreviate(s))
	}
	return int(math.Round(f)), nil
}

// memLimit is a pinned memory limit as the daemon reports it: the limit
// is at least mib and less than mib+unit. The daemon prints whole units
// of the largest that fits (a limit of 71885M reads "70G"; H200, driver
// 580.159.04), so the answer is exact only to its unit.
type memLimit struct{ mib, unit int64 }

// holds reports whether the limit may be exactly grant MiB.
func (l memLimit) holds(grant int64) bool { return grant >= l.mib && grant < l.mib+l.unit }

// parseMemoryLimit reads a pinned memory limit as the daemon prints it
// ("4G", "2048M", "512K"); an empty answer or 0 is no limit.
func parseMemoryLimit(s string) (memLimit, error) {
	if s == "" {
		return memLimit{}, nil
	}
	units := map[byte]int64{'K': 0, 'M': 1, 'G': 1 << 10, 'T': 1 << 20}
	u, ok := units[s[len(s)-1]]
	v, err := strconv.ParseUint(s[:len(s)-1], 10, 32)
	if !ok || err != nil {
		return memLimit{}, fmt.Errorf("MPS pinned memory limit %q: want a whole number and K, M, G or T", abbreviate(s))
	}
	if u == 0 { // kibibytes
		return memLimit{mib: int64(v) >> 10, unit: 1}, nil
	}
	return memLimit{mib: int64(v) * u, unit: u}, nil
}

// parsePinned reads mpsLimits.PinnedMemory ("0=1024M,1=2048M") into MiB
// per ordinal.
func parsePinned(s string) ([]int64, error) {
	var out []int64
	if s == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		o, v, ok := strings.Cut(f, "=")
		ordinal, err := strconv.Atoi(o)
		if !ok || err != nil || ordinal < 0 || ordinal >= 64 || !strings.HasSuffix(v, "M") {
			return nil, fmt.Errorf("MPS memory limits %q: want ORDINAL=MIBM, comma-separated", s)
		}
		mib, err := strconv.ParseInt(strings.TrimSuffix(v, "M"), 10, 64)
		if err != nil || mib < 0 {
			return nil, fmt.Errorf("MPS memory limits %q: want ORDINAL=MIBM, comma-separated", s)
		}
		for len(out) <= ordinal {
			out = append(out, 0)
		}
		out[ordinal] = mib
	}
	return out, nil
}

func abbreviate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

var _ types.EnforcementProver = (*node)(nil)
