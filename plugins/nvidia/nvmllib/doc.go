// Package nvmllib lets a Go plugin (.so) that links go-nvml load on any
// machine, with or without the NVIDIA driver.
//
// go-nvml's cgo code calls NVML's C functions directly and leaves them
// undefined, to be found in libnvidia-ml.so.1 once go-nvml opens it at run
// time. An executable tolerates that; a Go plugin does not: the runtime opens
// plugins with RTLD_NOW, so a .so that links go-nvml fails to load with
// "undefined symbol: nvml..." wherever the library is not already loaded
// into the process (everywhere, in practice, including the scheduler's
// control-plane hosts).
//
// This package defines every NVML function go-nvml calls as a small
// assembly trampoline that jumps through a table. Until Open binds the table
// to a library, every function returns NVML_ERROR_FUNCTION_NOT_FOUND; after,
// each calls the library's function of the same name (or still returns
// NVML_ERROR_FUNCTION_NOT_FOUND where an older driver lacks it, as NVML
// itself would). A program calls Open with the library's path before it
// calls go-nvml's Init with the same path.
//
// The trampolines exist for linux/amd64 and linux/arm64. The symbol list is
// generated from the go-nvml version in go.mod (go generate); a test fails
// when go.mod names another version than the one the list was generated
// from.
//
// Open is safe for concurrent use. The library stays loaded for the life of
// the process.
package nvmllib

//go:generate go run gen.go
