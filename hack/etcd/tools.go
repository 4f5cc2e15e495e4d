//go:build tools

// Package tools pins etcd 3.6 for upstream's scheduler_perf harness (make
// bench-schedperf), whose in-process etcd listens on a unix socket, which
// Debian's etcd 3.4 cannot. The tests' clusters keep Debian's etcd.
package tools

import _ "go.etcd.io/etcd/server/v3"
