package sysfs

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// TestReader: files are read within their bound and the budget; a longer
// file, or one over what is left, is an error that names it.
func TestReader(t *testing.T) {
	fsys := fstest.MapFS{"a": {Data: []byte(" 42\n")}, "big": {Data: []byte(strings.Repeat("x", 100))}}
	r := &Reader{FS: fsys, MaxFileBytes: 64, Budget: 10}
	if v, err := r.Line("a"); err != nil || v != "42" || r.Budget != 6 {
		t.Errorf("Line(a) = %q, %v, budget %d", v, err, r.Budget)
	}
	if _, err := r.File("big"); err == nil || !strings.Contains(err.Error(), "/big") {
		t.Errorf("a file over the budget: %v", err)
	}
	r.Budget = 1000
	if _, err := r.File("big"); err == nil || !strings.Contains(err.Error(), "longer than 64 bytes") {
		t.Errorf("a file over its bound: %v", err)
	}
}

// TestDRMNodes: the DRM minors of one vendor's PCI devices, not its
// connectors and not another vendor's.
func TestDRMNodes(t *testing.T) {
	fsys := fstest.MapFS{
		DRMDir + "/card0/device/uevent":      {Data: []byte("PCI_ID=1A03:2000\n")},
		DRMDir + "/card1/device/uevent":      {Data: []byte("DRIVER=amdgpu\nPCI_ID=1002:74A1\n")},
		DRMDir + "/card1-DP-1/device/uevent": {Data: []byte("PCI_ID=1002:74A1\n")},
		DRMDir + "/renderD128/device/uevent": {Data: []byte("PCI_ID=1002:74a1\n")},
	}
	r := &Reader{FS: fsys, MaxFileBytes: 64, Budget: 1000}
	if got := r.DRMNodes("1002"); !slices.Equal(got, []string{"/dev/dri/card1", "/dev/dri/renderD128"}) {
		t.Errorf("DRMNodes(1002) = %v", got)
	}
}
