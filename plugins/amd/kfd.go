package amd

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/kubegpu/kubegpu/plugins/sysfs"
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
	maxReadBytes   = 16 << 20 // all files of one discovery together
	maxPropertyLen = 128
	maxTopoRetries = 3
)

// IO link types, as kfd_sysfs.h numbers them (HSA_IOLINK_TYPE_*), and the
// link flags discovery heeds (HSA_IOLINK_FLAGS_*).
const (
	linkTypePCIe     = 2
	linkTypeXGMI     = 11
	linkEnabled      = 1 << 0
	linkNoPeerToPeer = 1 << 4
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

// reader reads the tree within the bounds above.
type reader struct {
	fsys fs.FS
	// budget is what is left of maxReadBytes.
	budget int
	// hidden counts the GPU nodes whose files the caller may not read.
	hidden int
}

// readTopology reads every node of the KFD topology in fsys (the host's
// root directory), in node order, and the topology's generation. The
// kernel renumbers nodes when a GPU goes: a walk that saw the generation
// change is read again. A tree without nodes is errNoKFD.
func readTopology(fsys fs.FS) (nodes []kfdNode, generation uint64, hidden int, err error) {
	for range maxTopoRetries {
		r := &reader{fsys: fsys, budget: maxReadBytes}
		before, err := r.generation()
		if err != nil {
			return nil, 0, 0, err
		}
		nodes, err := r.nodes()
		if err != nil {
			return nil, 0, 0, err
		}
		after, err := r.generation()
		if err != nil {
			return nil, 0, 0, err
		}
		if before == after {
			return nodes, after, r.hidden, nil
		}
	}
	return nil, 0, 0, fmt.Errorf("the KFD topology changed while it was read, %d times", maxTopoRetries)
}

var errNoKFD = errors.New("no KFD topology")

// generation is the topology's generation_id; 0 where the file is absent
// (recorded trees).
func (r *reader) generation() (uint64, error) {
	data, err := r.file(path.Join(TopologyDir, "generation_id"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	g, err := strconv.ParseUint(strings.TrimSpace(data), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s/generation_id %q: want a decimal number", TopologyDir, truncate(data))
	}
	return g, nil
}

func (r *reader) nodes() ([]kfdNode, error) {
	dir := path.Join(TopologyDir, "nodes")
	ids, err := r.numbered(dir, maxKFDNodes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: /%s does not exist (is the amdgpu driver loaded?)", errNoKFD, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read KFD topology: %w", err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: /%s has no nodes", errNoKFD, dir)
	}
	nodes := make([]kfdNode, 0, len(ids))
	for _, id := range ids {
		n, err := r.node(path.Join(dir, strconv.Itoa(id)), id)
		if errors.Is(err, fs.ErrPermission) {
			// amdkfd answers EPERM for the GPUs outside the reader's
			// device cgroup: not this reader's to serve.
			r.hidden++
			continue
		}
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func (r *reader) node(dir string, id int) (kfdNode, error) {
	n := kfdNode{id: id}
	var err error
	if n.props, err = r.properties(path.Join(dir, "properties")); err != nil {
		return n, err
	}
	gpuID, err := r.file(path.Join(dir, "gpu_id"))
	if err != nil {
		return n, err
	}
	if n.gpuID, err = strconv.ParseUint(strings.TrimSpace(gpuID), 10, 64); err != nil {
		return n, fmt.Errorf("KFD node %d: gpu_id %q: want a decimal number", id, truncate(strings.TrimSpace(gpuID)))
	}
	if !n.gpu() {
		return n, nil
	}
	banks, err := r.numberedProperties(path.Join(dir, "mem_banks"), maxMemBanks)
	if err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	for _, b := range banks {
		if t := b["heap_type"]; t == heapFBPublic || t == heapFBPrivate {
			n.vramBytes = min(n.vramBytes+b["size_in_bytes"], 1<<62) // saturating: sizes are below 2^62
		}
	}
	if n.ioLinks, err = r.numberedProperties(path.Join(dir, "io_links"), maxNodeLinks); err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	if n.p2pLinks, err = r.numberedProperties(path.Join(dir, "p2p_links"), maxNodeLinks); err != nil {
		return n, fmt.Errorf("KFD node %d: %w", id, err)
	}
	return n, nil
}

// numberedProperties reads the properties of each numbered subdirectory
// of dir (mem_banks/0, io_links/1, ...), in order; none if dir is absent.
func (r *reader) numberedProperties(dir string, limit int) ([]properties, error) {
	ids, err := r.numbered(dir, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]properties, 0, len(ids))
	for _, id := range ids {
		p, err := r.properties(path.Join(dir, strconv.Itoa(id), "properties"))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// numbered returns the numbers that name entries of dir, sorted; at most
// limit. Only canonical numbers count ("2", not "02" or "+2"), so that no
// entry is read twice under two names.
func (r *reader) numbered(dir string, limit int) ([]int, error) {
	entries, err := fs.ReadDir(r.fsys, dir)
	if err != nil {
		return nil, err
	}
	var ids []int
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil || id < 0 || strconv.Itoa(id) != e.Name() {
			continue
		}
		if len(ids) == limit {
			return nil, fmt.Errorf("/%s: more than %d entries", dir, limit)
		}
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids, nil
}

// properties parses a KFD properties file: one "key value" per line,
// value a decimal unsigned integer.
func (r *reader) properties(name string) (properties, error) {
	data, err := r.file(name)
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
			return nil, fmt.Errorf("/%s:%d: %q: want \"key value\"", name, i+1, truncate(line))
		}
		v, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("/%s:%d: %s: value %q: want a decimal number", name, i+1, key, truncate(value))
		}
		p[key] = v
	}
	return p, nil
}

// file reads a regular file of at most maxFileBytes, within the
// discovery's budget.
func (r *reader) file(name string) (string, error) {
	sr := sysfs.Reader{FS: r.fsys, MaxFileBytes: maxFileBytes, Budget: r.budget}
	data, err := sr.File(name)
	r.budget = sr.Budget
	return data, err
}

func truncate(s string) string { return sysfs.Truncate(s) }
