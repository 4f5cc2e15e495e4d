package nvidia

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What an MPS slice's limits cannot hold: a process of the container that
// does not connect to its daemon (CUDA_MPS_PIPE_DIRECTORY set elsewhere)
// gets a CUDA context of its own on the whole GPU. NVML lists it among the
// GPU's compute processes and not among its MPS clients. escapes finds such
// processes of a pod, by its UID in their cgroup path. MPS servers run in
// the shim's cgroup, never a pod's; a process's name is not looked at (a
// tenant can choose it).

// maxProcFileBytes bounds what escapes reads of a /proc file.
const maxProcFileBytes = 64 << 10

// escapes returns, for each GPU (by UUID) of the pod podUID's MPS slices,
// the processes of the pod computing on it outside MPS, as "PID N on GPU
// UUID". An error means NVML could not list a GPU's processes.
func (n *node) escapes(podUID string, uuids []string) ([]string, error) {
	handles := map[string]nvml.Device{}
	for _, g := range n.answeringGPUs() {
		handles[g.dev.UUID] = g.handle
	}
	var out []string
	for _, uuid := range uuids {
		h, ok := handles[uuid]
		if !ok {
			return nil, fmt.Errorf("GPU %s does not answer NVML", uuid)
		}
		procs, ret := h.GetComputeRunningProcesses()
		if err := nvmlError("list the compute processes of GPU "+uuid, ret); err != nil {
			return nil, err
		}
		clients, ret := h.GetMPSComputeRunningProcesses()
		if err := nvmlError("list the MPS clients of GPU "+uuid, ret); err != nil && !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) {
			return nil, err
		}
		mps := make(map[uint32]bool, len(clients))
		for _, c := range clients {
			mps[c.Pid] = true
		}
		for _, p := range procs {
			if mps[p.Pid] || !n.inPod(p.Pid, podUID) {
				continue
			}
			out = append(out, fmt.Sprintf("PID %d on GPU %s", p.Pid, uuid))
		}
	}
	return out, nil
}

// inPod reports whether the process's cgroup path names the pod: kubelet
// puts a pod's containers under ".../pod<UID>/..." (cgroupfs driver) or
// "...-pod<UID with underscores>.slice/..." (systemd driver).
func (n *node) inPod(pid uint32, podUID string) bool {
	b, err := readBounded(filepath.Join(n.procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil || podUID == "" {
		return false
	}
	s := string(b)
	return strings.Contains(s, "pod"+podUID) || strings.Contains(s, "pod"+strings.ReplaceAll(podUID, "-", "_"))
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcFileBytes))
}
