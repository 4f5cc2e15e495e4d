// Package proxy is kubegpu-crishim's CRI server. It serves on a unix socket
// and relays each client connection to its own connection to the container
// runtime (containerd), passing HTTP/2 frames through unchanged, so that
// every call, unary or streaming, known to this build or not, behaves
// exactly as the runtime answers it and costs little more than the copy.
// Only the calls it changes (CreateContainer) are decoded: their request is
// rewritten by an Interceptor and sent on within the runtime's flow-control
// windows, or refused with a gRPC status. See relay for the protocol
// details.
package proxy
