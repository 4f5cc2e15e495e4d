package cudaprobe

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

static void *lib;
static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuCtxSynchronize)(void);
static CUresult (*p_cuMemGetInfo)(size_t *, size_t *);
static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
static CUresult (*p_cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*p_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	unsigned, void *, void **, void **);
static CUresult (*p_cuGetErrorName)(CUresult, const char **);

// probe_open loads the library and its symbols; it returns the name of the
// first symbol missing, or NULL.
static const char *probe_open(const char *path) {
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) return "dlopen";
#define SYM(v, name) if (!(v = dlsym(lib, name))) return name;
	SYM(p_cuInit, "cuInit");
	SYM(p_cuDeviceGet, "cuDeviceGet");
	SYM(p_cuDeviceGetAttribute, "cuDeviceGetAttribute");
	SYM(p_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(p_cuCtxSetCurrent, "cuCtxSetCurrent");
	SYM(p_cuCtxSynchronize, "cuCtxSynchronize");
	SYM(p_cuMemGetInfo, "cuMemGetInfo_v2");
	SYM(p_cuMemAlloc, "cuMemAlloc_v2");
	SYM(p_cuMemFree, "cuMemFree_v2");
	SYM(p_cuModuleLoadData, "cuModuleLoadData");
	SYM(p_cuModuleGetFunction, "cuModuleGetFunction");
	SYM(p_cuLaunchKernel, "cuLaunchKernel");
	SYM(p_cuGetErrorName, "cuGetErrorName");
#undef SYM
	return NULL;
}

static const char *probe_dlerror(void) { return dlerror(); }

static CUresult probe_init(int ordinal, int *sms) {
	CUdevice dev;
	CUcontext ctx;
	CUresult r;
	if ((r = p_cuInit(0)) != 0) return r;
	if ((r = p_cuDeviceGet(&dev, ordinal)) != 0) return r;
	if ((r = p_cuDeviceGetAttribute(sms, 16, dev)) != 0) return r; // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	if ((r = p_cuDevicePrimaryCtxRetain(&ctx, dev)) != 0) return r;
	return p_cuCtxSetCurrent(ctx);
}

static CUresult probe_meminfo(size_t *free, size_t *total) { return p_cuMemGetInfo(free, total); }
static CUresult probe_alloc(CUdeviceptr *p, size_t n) { return p_cuMemAlloc(p, n); }
static CUresult probe_free(CUdeviceptr p) { return p_cuMemFree(p); }
static CUresult probe_sync(void) { return p_cuCtxSynchronize(); }

static CUresult probe_load(const char *ptx, const char *name, CUfunction *f) {
	CUmodule m;
	CUresult r;
	if ((r = p_cuModuleLoadData(&m, ptx)) != 0) return r;
	return p_cuModuleGetFunction(f, m, name);
}

static CUresult probe_launch(CUfunction f, unsigned blocks, unsigned threads, CUdeviceptr out, unsigned iters) {
	void *args[] = {&out, &iters};
	return p_cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, NULL, args, NULL);
}

static const char *probe_error_name(CUresult r) {
	const char *s = NULL;
	if (p_cuGetErrorName(r, &s) != 0 || !s) return "CUDA_ERROR_UNKNOWN";
	return s;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// DefaultLibrary is the driver library the probe opens.
const DefaultLibrary = "libcuda.so.1"

// Error is a CUDA driver-API error.
type Error struct {
	Call string
	Code int
	Name string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code) }

// ErrOutOfMemory is matched (errors.Is) by an Error whose code is
// CUDA_ERROR_OUT_OF_MEMORY.
var ErrOutOfMemory = errors.New("CUDA_ERROR_OUT_OF_MEMORY")

// Is makes errors.Is(err, ErrOutOfMemory) true for code 2.
func (e *Error) Is(target error) bool { return target == ErrOutOfMemory && e.Code == 2 }

func check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: C.GoString(C.probe_error_name(r))}
}

// Device is a CUDA context on one device, current on the calling OS
// thread. The probe is for one goroutine: Open locks it to its thread.
type Device struct {
	// SMs is the device's multiprocessor count.
	SMs  int
	spin C.CUfunction
	mu   sync.Mutex
}

var opened sync.Once
var openErr error

// Open loads lib (DefaultLibrary if empty), initialises CUDA and makes
// device ordinal's primary context current on this goroutine's thread,
// which stays locked to it.
func Open(lib string, ordinal int) (*Device, error) {
	if lib == "" {
		lib = DefaultLibrary
	}
	opened.Do(func() {
		cs := C.CString(lib)
		defer C.free(unsafe.Pointer(cs))
		if missing := C.probe_open(cs); missing != nil {
			name := C.GoString(missing)
			if name == "dlopen" {
				openErr = fmt.Errorf("open %s: %s", lib, C.GoString(C.probe_dlerror()))
			} else {
				openErr = fmt.Errorf("%s has no symbol %s", lib, name)
			}
		}
	})
	if openErr != nil {
		return nil, openErr
	}
	runtime.LockOSThread()
	var sms C.int
	if err := check("init", C.probe_init(C.int(ordinal), &sms)); err != nil {
		return nil, err
	}
	d := &Device{SMs: int(sms)}
	ptx := C.CString(spinPTX)
	defer C.free(unsafe.Pointer(ptx))
	name := C.CString("spin")
	defer C.free(unsafe.Pointer(name))
	if err := check("cuModuleLoadData", C.probe_load(ptx, name, &d.spin)); err != nil { //nolint:gocritic // cgo rewrites the call
		return nil, err
	}
	return d, nil
}

// MemInfo is cuMemGetInfo: free and total device memory as the context
// sees them, in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	var f, t C.size_t
	err = check("cuMemGetInfo", C.probe_meminfo(&f, &t))
	return uint64(f), uint64(t), err
}

// Alloc allocates n bytes of device memory and returns a function that
// frees them.
func (d *Device) Alloc(n uint64) (free func() error, err error) {
	var p C.CUdeviceptr
	if err := check(fmt.Sprintf("cuMemAlloc(%d MiB)", n>>20), C.probe_alloc(&p, C.size_t(n))); err != nil {
		return nil, err
	}
	return func() error { return check("cuMemFree", C.probe_free(p)) }, nil
}

// Spin launches the compute-bound kernel repeatedly for at least d and
// returns its rate: fused multiply-adds per second, in units of 10^9.
// warm, if not nil, is called once the kernel is compiled and has run
// once, before the timed launches.
// Every launch fills each multiprocessor with blocksPerSM blocks of 256
// threads, whatever share of them the context may use.
func (d *Device) Spin(dur time.Duration, warm func()) (float64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	const (
		threads     = 256
		blocksPerSM = 8
		iters       = 1 << 20
	)
	blocks := d.SMs * blocksPerSM
	var out C.CUdeviceptr
	if err := check("cuMemAlloc(out)", C.probe_alloc(&out, C.size_t(blocks*threads*4))); err != nil {
		return 0, err
	}
	defer C.probe_free(out)
	launch := func() error {
		if err := check("cuLaunchKernel", C.probe_launch(d.spin, C.uint(blocks), threads, out, iters)); err != nil {
			return err
		}
		return check("cuCtxSynchronize", C.probe_sync())
	}
	if err := launch(); err != nil { // JIT and warm-up
		return 0, err
	}
	if warm != nil {
		warm()
	}
	start := time.Now()
	n := 0
	for time.Since(start) < dur {
		if err := launch(); err != nil {
			return 0, err
		}
		n++
	}
	elapsed := time.Since(start).Seconds()
	return float64(n) * float64(blocks*threads) * float64(iters) / elapsed / 1e9, nil
}

// spinPTX is a compute-bound kernel: each thread runs a chain of iters
// dependent fused multiply-adds and stores the result, so nothing is
// optimised away. PTX ISA 7.0 for sm_70 and later; the driver compiles it
// for the GPU at hand.
const spinPTX = `
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(.param .u64 out, .param .u32 iters)
{
	.reg .pred p;
	.reg .f32 a, b;
	.reg .u32 i, n, tid, bid, bdim, gid;
	.reg .u64 o, off;

	ld.param.u64 o, [out];
	ld.param.u32 n, [iters];
	mov.u32 tid, %tid.x;
	mov.u32 bid, %ctaid.x;
	mov.u32 bdim, %ntid.x;
	mad.lo.u32 gid, bid, bdim, tid;
	cvt.rn.f32.u32 a, gid;
	mov.f32 b, 0f3F7FFFEF;
	mov.u32 i, 0;
LOOP:
	fma.rn.f32 a, a, b, b;
	fma.rn.f32 a, a, b, b;
	fma.rn.f32 a, a, b, b;
	fma.rn.f32 a, a, b, b;
	add.u32 i, i, 4;
	setp.lt.u32 p, i, n;
	@p bra LOOP;
	cvta.to.global.u64 o, o;
	mul.wide.u32 off, gid, 4;
	add.u64 o, o, off;
	st.global.f32 [o], a;
	ret;
}
`
