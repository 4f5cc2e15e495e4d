package nvmltest

// FakeLibrary is the C source of a libnvidia-ml with the NVML functions
// discovery calls for one GPU of a driver without NUMA, MIG, attribute or
// event support: a loaded nvidia.so runs go-nvml's real cgo code against
// it. The GPU is FakeLibraryGPU, an H100 at 0000:1b:00.0. Build it with
// plugintest.BuildCLibrary.
const FakeLibrary = `
#include <string.h>
typedef struct { unsigned long long total, free, used; } memory;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci;
static int gpu0;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) { if (i != 0) return 2; *d = &gpu0; return 0; }
int nvmlDeviceGetUUID(void *d, char *s, unsigned int n) {
	if (d != &gpu0) return 2;
	strncpy(s, "GPU-fa4e0000-0000-4000-8000-000000000000", n);
	return 0;
}
int nvmlDeviceGetName(void *d, char *s, unsigned int n) { strncpy(s, "NVIDIA H100 80GB HBM3", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *d, memory *m) { m->total = 81559ULL << 20; m->free = m->total; m->used = 0; return 0; }
int nvmlDeviceGetCudaComputeCapability(void *d, int *major, int *minor) { *major = 9; *minor = 0; return 0; }
int nvmlDeviceGetPciInfo_v3(void *d, pci *p) { memset(p, 0, sizeof *p); strcpy(p->busId, "00000000:1B:00.0"); p->bus = 0x1b; return 0; }
int nvmlDeviceGetNumGpuCores(void *d, unsigned int *n) { *n = 132 * 128; return 0; }
const char *nvmlErrorString(int r) { return r == 13 ? "Function Not Found" : "Unknown Error"; }
`

// FakeLibraryGPU is the UUID of FakeLibrary's GPU.
const FakeLibraryGPU = "GPU-fa4e0000-0000-4000-8000-000000000000"
