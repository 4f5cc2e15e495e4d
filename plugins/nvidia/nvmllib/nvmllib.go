package nvmllib

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>

const char *kubegpu_nvml_bind(const char *path, int *bound);
int kubegpu_nvml_has(const char *name);
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// DefaultPath is the NVML library go-nvml opens by default.
const DefaultPath = "libnvidia-ml.so.1"

// ErrNotFound is wrapped by Open's error when the library cannot be opened.
var ErrNotFound = errors.New("NVML library not found")

var (
	mu        sync.Mutex
	boundPath string
)

// Open binds the NVML trampolines to the library at path (a file name such
// as DefaultPath is looked up as dlopen does) and returns how many of the
// functions go-nvml calls the library has. The first successful Open wins:
// a later call with the same path is a no-op, one with another path is an
// error. The error of a failed Open wraps ErrNotFound and carries the
// dynamic loader's reason.
func Open(path string) (int, error) {
	if path == "" {
		return 0, errors.New("open NVML library: empty path")
	}
	mu.Lock()
	defer mu.Unlock()
	if boundPath != "" {
		if boundPath != path {
			return 0, fmt.Errorf("open NVML library %s: this process already uses %s", path, boundPath)
		}
		return len(symbols), nil
	}
	cPath := C.CString(path)
	defer C.free(unsafe.Pointer(cPath))
	var n C.int
	if msg := C.kubegpu_nvml_bind(cPath, &n); msg != nil {
		return 0, fmt.Errorf("%w: %s", ErrNotFound, C.GoString(msg))
	}
	boundPath = path
	return int(n), nil
}

// Has reports whether the library Open bound exports the function name,
// trampoline or not: how a caller learns what a driver offers beyond what
// go-nvml binds. False before Open.
func Has(name string) bool {
	mu.Lock()
	defer mu.Unlock()
	if boundPath == "" {
		return false
	}
	cName := C.CString(name)
	defer C.free(unsafe.Pointer(cName))
	return C.kubegpu_nvml_has(cName) != 0
}

// Symbols returns the names of the NVML functions with a trampoline.
func Symbols() []string { return append([]string(nil), symbols...) }
