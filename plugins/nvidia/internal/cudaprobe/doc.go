// Package cudaprobe is a minimal CUDA driver-API client for hardware checks:
// it opens libcuda.so.1 with dlopen at run time (no CUDA toolkit, no link
// against the driver, as go-nvml does for NVML), allocates device memory and
// times a compute-bound kernel given as PTX text (cuModuleLoadData JIT-
// compiles it for whatever GPU is there).
//
// It exists to prove what a slice's enforcer applies: inside an MPS
// client's environment, an allocation beyond the pinned memory limit fails
// and the kernel's rate follows the active thread percentage. Only tests
// (make test-nvidia-hardware) use it; nothing in a shipped binary does.
package cudaprobe
