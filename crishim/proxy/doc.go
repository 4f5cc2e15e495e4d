// Package proxy is kubegpu-crishim's CRI server: it serves the CRI v1
// RuntimeService and ImageService on a unix socket and forwards every call
// to the container runtime (containerd) as raw bytes, server streams such as
// GetContainerEvents and the streaming URLs of Exec, Attach and PortForward
// included, so that calls behave exactly as the runtime answers them. Only
// the calls it changes (CreateContainer) are decoded, rewritten by an
// Interceptor and encoded again.
package proxy
