// Package gpunode runs a real kubegpu node on loopback for the demo and the
// soak: containerd (internal/localnode) with the busybox image, kubegpu-crishim
// in front of it with the node's credentials, and a kubelet on the shim,
// registered with a cluster of internal/localcluster. Each part can be
// restarted alone, as an operator or a crash restarts it on a real node.
package gpunode
