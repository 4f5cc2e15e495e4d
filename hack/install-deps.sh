#!/usr/bin/env bash
# Installs what building and testing kubegpu need on a Debian machine, and
# only what is missing: a C compiler for cgo (Go plugins need it) and a Go
# toolchain new enough for go.mod (an older go >= 1.21 fetches the right one
# from the module proxy by itself), etcd for the integration tests, and what
# the local node (internal/localnode, make critest) runs containers with:
# runc, the CNI plugins, iptables and a static busybox for the test image.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
	if [ "$(id -u)" != 0 ]; then
		echo "install-deps: need Debian packages $*; run as root or install them first" >&2
		exit 1
	fi
	if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' 2>/dev/null | head -1)" ]; then
		apt-get update -qq
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

command -v gcc >/dev/null || apt_install gcc libc6-dev
command -v git >/dev/null || apt_install git
# The integration tests and the demo run a real etcd (Debian's 3.4).
command -v etcd >/dev/null || apt_install etcd-server
# The local node: containerd (built by make node-binaries) runs containers
# with runc, networks them with the CNI plugins in /usr/lib/cni (host ports
# through iptables), and the test image is built from /bin/busybox.
command -v runc >/dev/null || apt_install runc
command -v iptables >/dev/null || apt_install iptables
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/loopback ] || apt_install containernetworking-plugins
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx sh || apt_install busybox-static
# kubegpu ui's page is tested in headless Chromium (internal/browser).
command -v chromium >/dev/null || apt_install chromium fonts-dejavu-core

if ! command -v go >/dev/null; then
	if [ -x /usr/local/go/bin/go ]; then
		echo "install-deps: Go is at /usr/local/go/bin but not on PATH; add it: export PATH=\$PATH:/usr/local/go/bin" >&2
	else
		echo "install-deps: no Go toolchain; install Go >= 1.21 (it switches itself to the version go.mod names)" >&2
	fi
	exit 1
fi
if ! go version >/dev/null 2>&1; then
	echo "install-deps: the go command cannot run this module (go.mod wants go $(sed -n 's/^go //p' go.mod))" >&2
	exit 1
fi
