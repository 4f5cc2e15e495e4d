package amd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// TopologyDir is where the amdkfd driver publishes its topology, under the
// host's root (drivers/gpu/drm/amd/amdkfd/kfd_topology.c).
const TopologyDir = "sys/class/kfd/kfd/topology"

// Bounds on what discovery reads, whatever the tree holds: a KFD node per
// CPU socket and per GPU (or GPU partition), a link per peer.
const (
	maxKFDNodes    = 1024
	maxNodeLinks   = 1024
	maxMemBanks    = 64
	maxFileBytes   = 64 << 10
	maxPropertyLen = 128
)

// IO link types, as kfd_sysfs.h numbers them (HSA_IOLINK_TYPE_*).
const (
	linkTypePCIe = 2
	linkTypeXGMI = 11
)

// Memory heap types of a bank (HSA_MEM_HEAP_TYPE_*): the GPU's own memory,
// visible to the host or not.
const (
	heapFBPublic  = 1
	heapFBPrivate = 2
)

// kfdNode is one node of the KFD topology: a CPU socket, a GPU, or a
// partition of a GPU.
type kfdNode struct {
	// id is the node's number, its directory under nodes/.
	id    int
	gpuID uint64
	name  string
	props properties
	// vramBytes is the sum of the node's frame-buffer banks.
	vramBytes uint64
	ioLinks   []properties
	p2pLinks  []properties
}

// gpu reports whether the node is a GPU: CPU nodes have no SIMDs and no
// gpu_id.
func (n kfdNode) gpu() bool { return n.gpuID != 0 && n.props["simd_count"] > 0 }

// properties are a sysfs properties file's "key value" lines; every value
// amdkfd prints is a decimal unsigned integer.
type properties map[string]uint64

// readTopology reads every node of the KFD topology under root (the host's
// root directory), in node order. A tree without nodes is ErrNoKFD.
func readTopology(root string) ([]kfdNode, error) {
	dir := filepath.Join(root, TopologyDir, "nodes")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (is the amdgpu driver loaded?)", errNoKFD, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read KFD topology: %w", err)
	}
	ids, err := numbered(entries, maxKFDNodes, dir)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: %s has no nodes", errNoKFD, dir)
	}
	nodes := make([]kfdNode, 0, len(ids))
	for _, id := range ids {
		n, err := readNode(filepath.Join(dir, strconv.Itoa(id)), id)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

var errNoKFD = errors.New("no KFD topology")

func readNode(dir string, id int) (kfdNode, error) {
	n := kfdNode{id: id}
	var err error
	if n.props, err = readProperties(filepath.Join(dir, "properties")); err != nil {
		return n, err
	}
	gpuID, err := readFile(filepath.Join(dir, "gpu_id"))
	if err != nil {
		return n, err
	}
	if n.gpuID, err = strconv.ParseUint(strings.TrimSpace(gpuID), 10, 64); err != nil {
		return n, fmt.Errorf("KFD node %d: gpu_id %q: want a decimal number", id, strings.TrimSpace(gpuID))
	}
	if name, err := readFile(filepath.Join(dir, "name")); err == nil {
		n.name = strings.TrimSpace(name)
	}
	if !n.gpu() {
		return n, nil
	}
	banks, err := readNumbered(filepath.Join(dir, "mem_banks"), maxMemBanks)
	if err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	for _, b := range banks {
		if t := b["heap_type"]; t == heapFBPublic || t == heapFBPrivate {
			n.vramBytes += b["size_in_bytes"]
		}
	}
	if n.ioLinks, err = readNumbered(filepath.Join(dir, "io_links"), maxNodeLinks); err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	if n.p2pLinks, err = readNumbered(filepath.Join(dir, "p2p_links"), maxNodeLinks); err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	return n, nil
}

// readNumbered reads the properties of each numbered subdirectory of dir
// (mem_banks/0, io_links/1, ...), in order; none if dir is absent.
func readNumbered(dir string, limit int) ([]properties, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids, err := numbered(entries, limit, dir)
	if err != nil {
		return nil, err
	}
	out := make([]properties, 0, len(ids))
	for _, id := range ids {
		p, err := readProperties(filepath.Join(dir, strconv.Itoa(id), "properties"))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// numbered returns the numeric names among entries, sorted; at most limit.
func numbered(entries []os.DirEntry, limit int, dir string) ([]int, error) {
	var ids []int
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil || id < 0 {
			continue
		}
		if len(ids) == limit {
			return nil, fmt.Errorf("%s: more than %d entries", dir, limit)
		}
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids, nil
}

// readProperties parses a KFD properties file: one "key value" per line,
// value a decimal unsigned integer.
func readProperties(path string) (properties, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	p := properties{}
	for i, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		key, value, ok := strings.Cut(line, " ")
		if !ok || key == "" || len(key) > maxPropertyLen {
			return nil, fmt.Errorf("%s:%d: %q: want \"key value\"", path, i+1, truncate(line))
		}
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: value %q: want a decimal number", path, i+1, key, truncate(value))
		}
		p[key] = v
	}
	return p, nil
}

// readFile reads at most maxFileBytes of a sysfs file; a longer one is an
// error, not a silent cut.
func readFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(data) > maxFileBytes {
		return "", fmt.Errorf("%s: longer than %d bytes", path, maxFileBytes)
	}
	return string(data), nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
