#!/usr/bin/env bash
# Installs kubegpu-crishim on a GPU node. Run as root from a checkout after
# `make build plugins`, or from an unpacked release with the same layout:
#
#   crishim/deploy/install.sh --kubeconfig FILE --allocation-key PUBLIC_KEYS [--module NAME ...]
#       [--gpu-allowlist FILE] [--plugin-option nvidia.edits=env ...]
#
# --kubeconfig is the node's own credentials: kubelet's kubeconfig
# (/etc/kubernetes/kubelet.conf on a kubeadm node). It is linked, not
# copied, so that the shim follows kubelet's certificate rotation.
# --module names a device module to install (repeatable; default: nvidia).
# The simulated-GPU module (simgpu) is for demos and tests only. Each module
# is pinned to its SHA-256 (--plugin-sha256). --gpu-allowlist installs the
# GPU allowlist (monitoring agents; see crishim/README.md).
#
# Then point kubelet at the shim and restart it:
#   --container-runtime-endpoint=unix:///run/kubegpu/crishim.sock
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
kubeconfig= key= allowlist= args=() modules=()
while [ $# -gt 0 ]; do
	case $1 in
	--kubeconfig) kubeconfig=$2; shift 2 ;;
	--allocation-key) key=$2; shift 2 ;;
	--plugin-option) args+=("--plugin-option=$2"); shift 2 ;;
	--gpu-allowlist) allowlist=$2; shift 2 ;;
	--module) modules+=("$2"); shift 2 ;;
	*) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
[ -n "$kubeconfig" ] && [ -f "$kubeconfig" ] || { echo "install.sh: --kubeconfig FILE is required (the node's own credentials, kubelet's kubeconfig, e.g. /etc/kubernetes/kubelet.conf)" >&2; exit 2; }
[ -n "$key" ] && [ -f "$key" ] || { echo "install.sh: --allocation-key FILE is required (the scheduler's Ed25519 public key(s), PEM)" >&2; exit 2; }
bin=$root/_output/bin/kubegpu-crishim
[ -x "$bin" ] || { echo "install.sh: $bin missing; run make build plugins" >&2; exit 1; }
[ ${#modules[@]} -gt 0 ] || modules=(nvidia)
for m in "${modules[@]}"; do
	[ -f "$root/_output/plugins/$m.so" ] || { echo "install.sh: device module $root/_output/plugins/$m.so missing; run make plugins (modules built: $(cd "$root/_output/plugins" 2>/dev/null && ls *.so 2>/dev/null | tr '\n' ' '))" >&2; exit 1; }
done

install -D -m 0755 "$bin" /usr/local/bin/kubegpu-crishim
install -d -m 0755 /usr/lib/kubegpu/plugins
# Modules must come from the same build as the binary.
rm -f /usr/lib/kubegpu/plugins/*.so
for m in "${modules[@]}"; do
	install -o root -g root -m 0644 "$root/_output/plugins/$m.so" /usr/lib/kubegpu/plugins/
	args+=("--plugin-sha256=$m.so=$(sha256sum "/usr/lib/kubegpu/plugins/$m.so" | cut -d' ' -f1)")
done
install -d -m 0755 /etc/kubegpu
ln -sfn "$(readlink -f "$kubeconfig")" /etc/kubegpu/kubeconfig
# Public keys may be read by anyone; a shared HMAC secret must not be.
keymode=0644
grep -q 'KUBEGPU HMAC-SHA256 SECRET' "$key" && keymode=0600
install -D -m "$keymode" "$key" /etc/kubegpu/allocation-key.pub.pem
if [ -n "$allowlist" ]; then
	install -D -m 0644 "$allowlist" /etc/kubegpu/gpu-allowlist.yaml
	args+=("--gpu-allowlist=/etc/kubegpu/gpu-allowlist.yaml")
fi
printf 'KUBEGPU_CRISHIM_ARGS="%s"\n' "${args[*]:-}" > /etc/default/kubegpu-crishim
install -D -m 0644 "$root/crishim/deploy/kubegpu-crishim.service" /etc/systemd/system/kubegpu-crishim.service
systemctl daemon-reload
systemctl enable --now kubegpu-crishim
echo "kubegpu-crishim installed. Set kubelet's --container-runtime-endpoint=unix:///run/kubegpu/crishim.sock and restart kubelet."
