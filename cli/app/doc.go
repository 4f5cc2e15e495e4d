// Package app holds the kubegpu CLI's cobra commands: gpus (every GPU with
// what its pods use), explain (per node, why a pod fits or not, from the
// engine kubegpu-scheduler uses), ui (a live page of both, served from
// watches; package cli/ui serves it), pods (a namespace's view for its
// tenants), keys and version. Commands take kubectl's kubeconfig flags and
// only read from the API server.
package app
