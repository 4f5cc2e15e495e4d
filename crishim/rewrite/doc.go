// Package rewrite decides which devices a container gets and rewrites its
// CRI ContainerConfig accordingly. It is pure: the allocation comes from the
// sandbox config kubelet passes with CreateContainer (never from an API
// read), and the edits from the node's device modules.
//
//   - A container whose pod carries a valid allocation (signed with the
//     cluster's key, for this pod's namespace, name and UID, on this node)
//     gets exactly the devices allocated to it by name.
//   - A container without an allocation, or not named in it, gets the edits
//     that hide every device (e.g. NVIDIA_VISIBLE_DEVICES=void), so that an
//     image whose env says "all" sees no GPU.
//   - A forged or mismatched allocation is refused: CreateContainer fails
//     with an error kubelet shows in the pod's events.
//
// Edits replace what the container asked for itself: an env variable a
// module sets overrides the pod's own of the same name. Strip removes every
// other way to a GPU a container config brings (device nodes and mounts of
// /dev/nvidia*, the NVIDIA runtime's device-list mounts, GPU CDI devices in
// the config and its cdi.k8s.io annotations), Masks hides the host's GPU
// device nodes from privileged containers, and an Allowlist names the pods
// (monitoring agents) exempt from both.
package rewrite
