package nvidia

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
// UUID". Where NVML cannot say (a GPU that does not answer, or a driver
// that cannot list a GPU's compute processes or its MPS clients: without
// the latter every client would look like an escape), unknown says why and
// nothing is reported for that GPU: the limits are proven, the escapes are
// not.
func (n *node) escapes(podUID string, uuids []string) (found []string, unknown string) {
	handles := map[string]nvml.Device{}
	for _, g := range n.answeringGPUs() {
		handles[g.dev.UUID] = g.handle
	}
	var why []string
	for _, uuid := range uuids {
		h, ok := handles[uuid]
		if !ok {
			why = append(why, "GPU "+uuid+" does not answer NVML")
			continue
		}
		procs, ret := h.GetComputeRunningProcesses()
		if err := nvmlError("list the compute processes of GPU "+uuid, ret); err != nil {
			why = append(why, err.Error())
			continue
		}
		clients, ret := h.GetMPSComputeRunningProcesses()
		if err := nvmlError("list the MPS clients of GPU "+uuid, ret); err != nil {
			why = append(why, err.Error())
			continue
		}
		mps := make(map[uint32]bool, len(clients))
		for _, c := range clients {
			mps[c.Pid] = true
		}
		for _, p := range procs {
			if mps[p.Pid] || n.podOf(p.Pid) != podUID {
				continue
			}
			found = append(found, fmt.Sprintf("PID %d on GPU %s", p.Pid, uuid))
		}
	}
	return found, strings.Join(why, "; ")
}

// podOf is the UID of the pod whose cgroup holds the process, as kubelet
// names it: the first path segment "pod<UID>" right under a "kubepods..."
// one (cgroupfs driver), or "kubepods[-QOS]-pod<UID_>.slice" (systemd
// driver, dashes of the UID as underscores); "" if none. Only the first
// such segment counts: a cgroup a container makes below its own cannot
// name another pod.
func (n *node) podOf(pid uint32) string {
	b, err := readBounded(filepath.Join(n.procRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// "ID:CONTROLLERS:PATH"; the path may hold colons.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if uid := kubeletPod(parts[2]); uid != "" {
			return uid
		}
	}
	return ""
}

// kubeletPod finds the pod in a cgroup path (see podOf): after the first
// segment starting "kubepods", the systemd driver's
// "kubepods[-QOS]-pod<UID_>.slice" within two more, or the cgroupfs
// driver's "pod<UID>" right after it or after its QOS class.
func kubeletPod(path string) string {
	segs := strings.Split(path, "/")
	i := slices.IndexFunc(segs, func(s string) bool { return strings.HasPrefix(s, "kubepods") })
	if i < 0 {
		return ""
	}
	if strings.HasSuffix(segs[i], ".slice") {
		for _, seg := range segs[i:min(i+3, len(segs))] {
			if !strings.HasPrefix(seg, "kubepods") || !strings.HasSuffix(seg, ".slice") {
				return ""
			}
			if j := strings.Index(seg, "-pod"); j >= 0 {
				return strings.ReplaceAll(strings.TrimSuffix(seg[j+len("-pod"):], ".slice"), "_", "-")
			}
		}
		return ""
	}
	for _, seg := range segs[i+1 : min(i+3, len(segs))] {
		if seg == "burstable" || seg == "besteffort" {
			continue
		}
		if uid, ok := strings.CutPrefix(seg, "pod"); ok {
			return uid
		}
		return ""
	}
	return ""
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcFileBytes))
}
