// Package sysfs reads the small text files of a sysfs tree (or a tree
// recorded from one) within bounds: a device module's discovery reads at
// most a given number of bytes per file and in all, whatever the tree
// holds, and a file over its bound is an error that names it, not a
// silent cut.
package sysfs

import (
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
)

// Reader reads files of FS (the host's root directory, or a recorded
// tree) within its bounds. It is not safe for concurrent use.
type Reader struct {
	FS fs.FS
	// MaxFileBytes bounds each file.
	MaxFileBytes int
	// Budget is what is left of the bytes the discovery may read in all;
	// each File takes what it read.
	Budget int
}

// File reads a regular file of at most MaxFileBytes, within the budget.
func (r *Reader) File(name string) (string, error) {
	fi, err := fs.Stat(r.FS, name)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("/%s: not a regular file", name)
	}
	f, err := r.FS.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	limit := min(r.MaxFileBytes, r.Budget)
	data, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return "", err
	}
	if len(data) > limit {
		if limit < r.MaxFileBytes {
			return "", fmt.Errorf("/%s: the tree holds more than the %d bytes a discovery reads", name, r.Budget)
		}
		return "", fmt.Errorf("/%s: longer than %d bytes", name, r.MaxFileBytes)
	}
	r.Budget -= len(data)
	return string(data), nil
}

// Line reads a one-line file, without the surrounding white space.
func (r *Reader) Line(name string) (string, error) {
	data, err := r.File(name)
	return strings.TrimSpace(data), err
}

// Truncate shortens a value quoted in an error to 64 bytes.
func Truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// DRMDir is where the kernel lists DRM devices, under the host's root.
const DRMDir = "sys/class/drm"

// maxDRMEntries bounds the entries of DRMDir DRMNodes reads.
const maxDRMEntries = 1024

// DRMNodes lists, as paths under /dev, the DRM device nodes (cardN,
// renderDN) of the PCI devices of vendor (a PCI vendor ID as uevent
// prints it, "1002"), from each entry's device/uevent: every node a
// container could reach the vendor's GPUs through, whichever the
// module's discovery serves.
func (r *Reader) DRMNodes(vendor string) []string {
	entries, err := fs.ReadDir(r.FS, DRMDir)
	if err != nil {
		return nil
	}
	var out []string
	for i, e := range entries {
		if i == maxDRMEntries {
			break
		}
		_, card := Number(e.Name(), "card")
		_, render := Number(e.Name(), "renderD")
		if !card && !render {
			continue // a connector (card0-DP-1)
		}
		ev, err := r.Uevent(DRMDir + "/" + e.Name() + "/device/uevent")
		if err != nil {
			continue
		}
		if v, _, _ := strings.Cut(ev["PCI_ID"], ":"); strings.EqualFold(v, vendor) {
			out = append(out, "/dev/dri/"+e.Name())
		}
	}
	return out
}

// Uevent reads a uevent file's KEY=VALUE lines.
func (r *Reader) Uevent(name string) (map[string]string, error) {
	data, err := r.File(name)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(data, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			out[k] = v
		}
	}
	return out, nil
}

// Number parses a sysfs entry's name of prefix and a canonical decimal
// number (card3; not card03, card3-DP-1 or a number over 2^20), so that
// no entry is read twice under two names.
func Number(name, prefix string) (int, bool) {
	s, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 1<<20 || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}
