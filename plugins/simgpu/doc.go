// Package simgpu is a device module of simulated GPUs, for demos, tests and
// placement experiments on machines without GPUs.
//
// The node side reports the GPUs of a topology (a built-in preset such as
// dgx1, dgx-a100, dgx-h100, t4x4, or the single-model nodes of the Alibaba
// openb trace, or a YAML file; see Topology) with the links between them,
// and turns an allocation into the environment a real GPU container would
// get (NVIDIA_VISIBLE_DEVICES=<uuids>, or CDI device names). The scheduler
// side rates links as the NVIDIA module does (package gpulink).
//
// With enforcer-root, an enforcer stand-in with the read-back interface of
// MPS (types.EnforcementProver) gives each container with slices a limits
// file that it may rewrite, so that hosts' enforcement policy, proof and
// refusal paths run end to end without a GPU (see enforcer.go).
//
// Options (--plugin-option simgpu.KEY=VALUE): preset, topology, gpus,
// unhealthy, health-file, edits, enforcer-root. The .so's main package is
// in ./plugin.
package simgpu
