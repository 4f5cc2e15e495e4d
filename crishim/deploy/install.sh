#!/usr/bin/env bash
# Installs, upgrades in place, or uninstalls kubegpu-crishim on a GPU node.
# Run as root from a checkout after `make build plugins`, or from an
# unpacked release with the same layout (--from DIR: DIR/bin, DIR/plugins).
#
# Install or upgrade (the same command; running it again changes nothing):
#
#   crishim/deploy/install.sh --kubeconfig FILE --allocation-key PUBLIC_KEYS [--module NAME ...]
#       [--gpu-allowlist FILE] [--plugin-option nvidia.edits=env ...]
#       [--kubelet-config /var/lib/kubelet/config.yaml] [--kubelet-flags /var/lib/kubelet/kubeadm-flags.env]
#       [--from DIR] [--no-preflight]
#
# --kubeconfig is the node's own credentials: kubelet's kubeconfig
# (/etc/kubernetes/kubelet.conf on a kubeadm node). It is linked, not
# copied, so that the shim follows kubelet's certificate rotation.
# --module names a device module to install (repeatable; default: nvidia).
# The simulated-GPU module (simgpu) is for demos and tests only. Each module
# is pinned to its SHA-256 (--plugin-sha256). --gpu-allowlist installs the
# GPU allowlist (monitoring agents; see crishim/README.md).
#
# Before anything installed is touched, the new binary loads the new
# modules with the node's options (`kubegpu-crishim devices`): a build whose
# modules do not load on this node is refused and the running shim is left
# alone (--no-preflight skips this, e.g. while a GPU fails discovery).
# Files are replaced by rename, the modules as one directory. The unit is
# restarted only when the binary, a module, the key, the allowlist, the
# kubeconfig link, the options or the unit changed; containers keep running
# through the restart (their state is containerd's).
#
# --kubelet-config points kubelet's KubeletConfiguration at the shim
# (containerRuntimeEndpoint); --kubelet-flags does the same to a
# --container-runtime-endpoint flag in an environment file of kubelet's
# flags (kubeadm's kubeadm-flags.env), which overrides the configuration.
# The previous values are kept under /etc/kubegpu/restore, and kubelet is
# restarted when one changed. Without either, set kubelet's
# --container-runtime-endpoint=unix:///run/kubegpu/crishim.sock yourself.
#
# Uninstall:
#
#   crishim/deploy/install.sh --uninstall
#
# restores kubelet's endpoint where install changed it and restarts
# kubelet (which then talks to containerd; running containers stay), then
# stops and disables the unit and removes everything install wrote.
#
# Environment, for tests and image builds: KUBEGPU_ROOT (default /) is
# prefixed to every path on the node the script reads or writes;
# KUBEGPU_SYSTEMCTL (default systemctl) is the command that manages units,
# called as `$KUBEGPU_SYSTEMCTL daemon-reload|enable UNIT|start UNIT|
# restart UNIT|disable --now UNIT`.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)/_output
unit_src=$(cd "$(dirname "$0")" && pwd)/kubegpu-crishim.service
R=${KUBEGPU_ROOT:-}
R=${R%/}
SYSTEMCTL=${KUBEGPU_SYSTEMCTL:-systemctl}
endpoint=unix:///run/kubegpu/crishim.sock

bin_dst=$R/usr/local/bin/kubegpu-crishim
plugin_dst=$R/usr/lib/kubegpu/plugins
etc=$R/etc/kubegpu
restore=$etc/restore
args_dst=$R/etc/default/kubegpu-crishim
unit_dst=$R/etc/systemd/system/kubegpu-crishim.service

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

uninstall=0 preflight=1 kubeconfig= key= allowlist= kubelet_config= kubelet_flags=
args=() modules=()
while [ $# -gt 0 ]; do
	case $1 in
	--uninstall) uninstall=1; shift ;;
	--kubeconfig) kubeconfig=$2; shift 2 ;;
	--allocation-key) key=$2; shift 2 ;;
	--plugin-option) args+=("--plugin-option=$2"); shift 2 ;;
	--gpu-allowlist) allowlist=$2; shift 2 ;;
	--module) modules+=("$2"); shift 2 ;;
	--kubelet-config) kubelet_config=$2; shift 2 ;;
	--kubelet-flags) kubelet_flags=$2; shift 2 ;;
	--from) src=$(cd "$2" && pwd); shift 2 ;;
	--no-preflight) preflight=0; shift ;;
	*) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || die "run as root"

# put MODE SRC DST installs SRC as DST (root's, MODE) by rename, unless DST
# already is that; it sets changed=1 when it wrote.
changed=0
put() {
	local mode=$1 from=$2 to=$3
	if [ -f "$to" ] && [ ! -L "$to" ] && cmp -s "$from" "$to" && [ "$(stat -c '%a %u' "$to")" = "${mode#0} 0" ]; then
		return 0
	fi
	install -D -o root -g root -m "$mode" "$from" "$to.kubegpu-new"
	mv -f "$to.kubegpu-new" "$to"
	changed=1
}

# remove PATH... removes what exists, setting changed=1.
remove() {
	local p
	for p in "$@"; do
		if [ -e "$p" ] || [ -L "$p" ]; then
			rm -rf "$p"
			changed=1
		fi
	done
}

# Kubelet's endpoint. set_config FILE points a KubeletConfiguration at the
# shim; set_flags FILE rewrites a --container-runtime-endpoint flag. Each
# records the previous value once (a second install keeps the first
# record) and sets kubelet_changed=1 when it wrote.
kubelet_changed=0
set_config() {
	local file=$1 line cur
	[ -f "$file" ] || die "--kubelet-config $file: no such file"
	line="containerRuntimeEndpoint: $endpoint"
	cur=$(grep -m1 '^containerRuntimeEndpoint:' "$file" || true)
	[ "$cur" = "$line" ] && return 0
	if [ ! -f "$restore/kubelet-config" ]; then
		install -d -m 0700 "$restore"
		printf '%s\n%s\n' "$file" "$cur" > "$restore/kubelet-config"
	fi
	LINE=$line awk '/^containerRuntimeEndpoint:/ { if (!done) print ENVIRON["LINE"]; done = 1; next }
		{ print } END { if (!done) print ENVIRON["LINE"] }' "$file" > "$file.kubegpu-new"
	chmod --reference="$file" "$file.kubegpu-new"
	mv -f "$file.kubegpu-new" "$file"
	kubelet_changed=1
}
flag_value() { grep -o -m1 -- '--container-runtime-endpoint[= ][^" ]*' "$1" | sed 's/^--container-runtime-endpoint[= ]//' || true; }
# rewrite_flag FILE VALUE sets every --container-runtime-endpoint in FILE
# to VALUE (plain awk: Debian's is mawk).
rewrite_flag() {
	VALUE=$2 awk '{
		out = ""; s = $0
		while (match(s, /--container-runtime-endpoint[= ][^" ]*/)) {
			out = out substr(s, 1, RSTART - 1) "--container-runtime-endpoint=" ENVIRON["VALUE"]
			s = substr(s, RSTART + RLENGTH)
		}
		print out s
	}' "$1" > "$1.kubegpu-new"
	chmod --reference="$1" "$1.kubegpu-new"
	mv -f "$1.kubegpu-new" "$1"
}
set_flags() {
	local file=$1 cur
	[ -f "$file" ] || die "--kubelet-flags $file: no such file"
	cur=$(flag_value "$file")
	if [ -z "$cur" ]; then
		[ -n "$kubelet_config" ] && return 0
		die "kubelet's flags in $file do not set --container-runtime-endpoint; give --kubelet-config (kubelet's configuration file) instead"
	fi
	[ "$cur" = "$endpoint" ] && return 0
	if [ ! -f "$restore/kubelet-flags" ]; then
		install -d -m 0700 "$restore"
		printf '%s\n%s\n' "$file" "$cur" > "$restore/kubelet-flags"
	fi
	rewrite_flag "$file" "$endpoint"
	kubelet_changed=1
}

# restore_kubelet puts back what set_config and set_flags changed, where
# it is still the shim's endpoint (an operator's later change is kept).
restore_kubelet() {
	local file prev cur
	if [ -f "$restore/kubelet-config" ]; then
		{ IFS= read -r file; IFS= read -r prev; } < "$restore/kubelet-config"
		cur=$(grep -m1 '^containerRuntimeEndpoint:' "$file" 2>/dev/null || true)
		if [ "$cur" = "containerRuntimeEndpoint: $endpoint" ]; then
			LINE=$prev awk '/^containerRuntimeEndpoint:/ { if (ENVIRON["LINE"] != "") print ENVIRON["LINE"]; next } { print }' "$file" > "$file.kubegpu-new"
			chmod --reference="$file" "$file.kubegpu-new"
			mv -f "$file.kubegpu-new" "$file"
			kubelet_changed=1
			say "restored kubelet's ${prev:-default containerRuntimeEndpoint (line removed)} in $file"
		else
			say "kubelet's containerRuntimeEndpoint in $file is no longer the shim's; left as it is"
		fi
	fi
	if [ -f "$restore/kubelet-flags" ]; then
		{ IFS= read -r file; IFS= read -r prev; } < "$restore/kubelet-flags"
		if [ "$(flag_value "$file")" = "$endpoint" ]; then
			rewrite_flag "$file" "$prev"
			kubelet_changed=1
			say "restored kubelet's --container-runtime-endpoint=$prev in $file"
		else
			say "kubelet's --container-runtime-endpoint in $file is no longer the shim's; left as it is"
		fi
	fi
}

if [ "$uninstall" = 1 ]; then
	restore_kubelet
	if [ "$kubelet_changed" = 1 ]; then
		$SYSTEMCTL restart kubelet
	elif [ ! -d "$restore" ] && [ -f "$unit_dst" ]; then
		say "kubelet's endpoint was not set by install.sh: point its --container-runtime-endpoint back at containerd before the shim is gone"
	fi
	if [ -f "$unit_dst" ]; then
		$SYSTEMCTL disable --now kubegpu-crishim
	fi
	remove "$unit_dst" "$args_dst" "$bin_dst" "$R/usr/lib/kubegpu" "$etc"
	if [ "$changed" = 1 ]; then
		$SYSTEMCTL daemon-reload
		say "kubegpu-crishim uninstalled"
	else
		say "kubegpu-crishim is not installed; nothing to do"
	fi
	exit 0
fi

[ -n "$kubeconfig" ] && [ -f "$kubeconfig" ] || { echo "install.sh: --kubeconfig FILE is required (the node's own credentials, kubelet's kubeconfig, e.g. /etc/kubernetes/kubelet.conf)" >&2; exit 2; }
[ -n "$key" ] && [ -f "$key" ] || { echo "install.sh: --allocation-key FILE is required (the scheduler's Ed25519 public key(s), PEM)" >&2; exit 2; }
[ -z "$allowlist" ] || [ -f "$allowlist" ] || die "--gpu-allowlist $allowlist: no such file"
bin=$src/bin/kubegpu-crishim
[ -x "$bin" ] || die "$bin missing; run make build plugins"
[ ${#modules[@]} -gt 0 ] || modules=(nvidia)
for m in "${modules[@]}"; do
	[ -f "$src/plugins/$m.so" ] || die "device module $src/plugins/$m.so missing; run make plugins (modules built: $(cd "$src/plugins" 2>/dev/null && ls *.so 2>/dev/null | tr '\n' ' '))"
done
old_version=$("$bin_dst" version 2>/dev/null || echo none)
new_version=$("$bin" version)

# The modules, staged beside the installed ones and pinned.
stage=$plugin_dst.kubegpu-new
rm -rf "$stage"
install -d -o root -g root -m 0755 "$R/usr/lib/kubegpu" "$stage"
for m in "${modules[@]}"; do
	install -o root -g root -m 0644 "$src/plugins/$m.so" "$stage/$m.so"
	args+=("--plugin-sha256=$m.so=$(sha256sum "$stage/$m.so" | cut -d' ' -f1)")
done
if [ -n "$allowlist" ]; then
	args+=("--gpu-allowlist=/etc/kubegpu/gpu-allowlist.yaml")
fi
if [ "$preflight" = 1 ]; then
	pre=("--plugin-dir=$stage")
	for a in "${args[@]}"; do
		case $a in --plugin-option=* | --plugin-sha256=*) pre+=("$a") ;; esac
	done
	if ! out=$("$bin" devices "${pre[@]}" 2>&1); then
		rm -rf "$stage"
		printf '%s\n' "$out" >&2
		running="$old_version keeps running"
		[ "$old_version" != none ] || running="nothing was installed"
		die "the new build's device modules do not load on this node (above); nothing was changed: $running"
	fi
fi

put 0755 "$bin" "$bin_dst"
# The modules: the staged directory replaces the installed one when any
# file differs (by two renames: a shim starting in between finds no
# directory and says so).
if diff -r -q "$stage" "$plugin_dst" >/dev/null 2>&1; then
	rm -rf "$stage"
else
	rm -rf "$plugin_dst.kubegpu-old"
	[ ! -d "$plugin_dst" ] || mv "$plugin_dst" "$plugin_dst.kubegpu-old"
	mv "$stage" "$plugin_dst"
	rm -rf "$plugin_dst.kubegpu-old"
	changed=1
fi
install -d -m 0755 "$etc"
target=$(readlink -f "$kubeconfig")
if [ "$(readlink "$etc/kubeconfig" 2>/dev/null || true)" != "$target" ]; then
	ln -sfn "$target" "$etc/kubeconfig"
	changed=1
fi
# Public keys may be read by anyone; a shared HMAC secret must not be.
keymode=0644
grep -q 'KUBEGPU HMAC-SHA256 SECRET' "$key" && keymode=0600
put "$keymode" "$key" "$etc/allocation-key.pub.pem"
if [ -n "$allowlist" ]; then
	put 0644 "$allowlist" "$etc/gpu-allowlist.yaml"
else
	remove "$etc/gpu-allowlist.yaml"
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
printf 'KUBEGPU_CRISHIM_ARGS="%s"\n' "${args[*]:-}" > "$tmp"
put 0644 "$tmp" "$args_dst"
files_changed=$changed
changed=0
put 0644 "$unit_src" "$unit_dst"
if [ "$changed" = 1 ]; then
	$SYSTEMCTL daemon-reload
fi
[ "$files_changed" = 0 ] || changed=1

$SYSTEMCTL enable kubegpu-crishim
if [ "$changed" = 1 ]; then
	$SYSTEMCTL restart kubegpu-crishim
	say "$new_version installed and (re)started (was: $old_version)"
else
	$SYSTEMCTL start kubegpu-crishim
	say "$new_version already installed; nothing changed"
fi

[ -z "$kubelet_config" ] || set_config "$R$kubelet_config"
[ -z "$kubelet_flags" ] || set_flags "$R$kubelet_flags"
if [ "$kubelet_changed" = 1 ]; then
	$SYSTEMCTL restart kubelet
	say "kubelet now talks to the shim ($endpoint) and was restarted"
elif [ -z "$kubelet_config$kubelet_flags" ]; then
	say "set kubelet's --container-runtime-endpoint=$endpoint and restart kubelet, if not done yet"
fi
