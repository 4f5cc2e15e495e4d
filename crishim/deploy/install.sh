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
#       [--from DIR] [--no-preflight] [--no-resource-slices]
#
# --kubeconfig is the node's own credentials: kubelet's kubeconfig
# (/etc/kubernetes/kubelet.conf on a kubeadm node). It is linked, not
# copied, so that the shim follows kubelet's certificate rotation.
# --module names a device module to install (repeatable; default: nvidia).
# The simulated-GPU module (simgpu) is for demos and tests only. Each module
# is pinned to its SHA-256 (--plugin-sha256). --gpu-allowlist installs the
# GPU allowlist (monitoring agents; see crishim/README.md).
# --no-resource-slices keeps the node's devices out of ResourceSlices
# (kubegpu-crishim --publish-resource-slices=false).
#
# Before anything installed is touched, the new binary loads the new
# modules with the node's options (`kubegpu-crishim devices`): a build whose
# modules do not load on this node is refused and the running shim is left
# alone (--no-preflight skips this, e.g. while a GPU fails discovery).
# A --plugin-option value may hold printable ASCII only (spaces and quotes
# included): the options reach the shim through systemd's EnvironmentFile,
# which cannot carry a newline or control character and drops a line that
# is not valid UTF-8, so such a value is refused before anything is done.
#
# Layout: each build is a release directory,
#   /usr/lib/kubegpu/releases/ID/{kubegpu-crishim,plugins/,kubegpu-crishim.env}
# (ID: digest of its files), and one symbolic link,
#   /usr/lib/kubegpu/current -> releases/ID,
# selects the one that runs: /usr/local/bin/kubegpu-crishim and
# /etc/default/kubegpu-crishim (the unit's EnvironmentFile) are links
# through it, and the options in that file name the release's own plugin
# directory by its real path (the shim refuses one reached through a link).
# Replacing `current` by rename switches binary, modules, pins and options
# together: a shim started at any moment (Restart=always) gets one whole
# release. The unit is restarted only when the release, the key, the
# allowlist, the kubeconfig link or the unit changed; containers keep
# running through the restart (their state is containerd's).
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
#   crishim/deploy/install.sh --uninstall [--force]
#       [--kubelet-config FILE] [--kubelet-flags FILE]
#
# restores kubelet's endpoint where install changed it and restarts
# kubelet (which then talks to containerd; running containers stay), then
# stops and disables the unit, removes the node's ResourceSlices and its
# GPUs on the Node (kubegpu-crishim unpublish) and everything install wrote. With
# no record of kubelet's endpoint under /etc/kubegpu/restore (install was
# not given --kubelet-config or --kubelet-flags), it refuses unless
# kubelet's own files (those given, kubeadm-flags.env, /etc/default/kubelet,
# /etc/sysconfig/kubelet, kubelet.service.d drop-ins, config.yaml) show an
# endpoint other than the shim's and none of them names the shim's socket:
# removing the shim under a kubelet that talks to it leaves the node
# NotReady. --force removes the shim anyway and leaves kubelet's endpoint as
# it is, for the operator to point back at containerd by hand.
#
# Environment, for tests and image builds: KUBEGPU_ROOT (default /) is
# prefixed to every path on the node the script reads or writes;
# KUBEGPU_SYSTEMCTL (default systemctl) is the command that manages units,
# called as `$KUBEGPU_SYSTEMCTL daemon-reload|enable UNIT|start UNIT|
# restart UNIT|disable --now UNIT`. For tests only:
# KUBEGPU_INSTALL_FAIL_AFTER=PATTERN makes the script fail right after it
# has swapped in (or moved aside) a node path that matches the shell
# pattern (e.g. /usr/lib/kubegpu/current or '/usr/lib/kubegpu/releases/*'),
# to check that a failure rolls back.
set -euo pipefail
# Byte-wise patterns and sorting, whatever the operator's locale.
export LC_ALL=C

src=$(cd "$(dirname "$0")/../.." && pwd)/_output
unit_src=$(cd "$(dirname "$0")" && pwd)/kubegpu-crishim.service
R=${KUBEGPU_ROOT:-}
R=${R%/}
SYSTEMCTL=${KUBEGPU_SYSTEMCTL:-systemctl}
endpoint=unix:///run/kubegpu/crishim.sock

lib=$R/usr/lib/kubegpu
releases=$lib/releases
current=$lib/current
bin_dst=$R/usr/local/bin/kubegpu-crishim
args_dst=$R/etc/default/kubegpu-crishim
etc=$R/etc/kubegpu
restore=$etc/restore
unit_dst=$R/etc/systemd/system/kubegpu-crishim.service
# The modules' directory before releases (a directory of its own).
old_plugin_dst=$lib/plugins

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

# check_option VALUE refuses a --plugin-option value that systemd's
# EnvironmentFile cannot carry (see the header): printable ASCII only.
check_option() {
	case $1 in
	*[![:print:]]*)
		printf 'install.sh: --plugin-option %q: refused: a value may hold printable ASCII only (spaces and quotes are fine); a newline, a control character or a non-ASCII byte cannot be passed safely through the unit'"'"'s EnvironmentFile\n' "$1" >&2
		exit 2 ;;
	esac
}

uninstall=0 force=0 preflight=1 kubeconfig='' key='' allowlist='' kubelet_config='' kubelet_flags=''
args=() modules=()
while [ $# -gt 0 ]; do
	case $1 in
	--uninstall) uninstall=1; shift ;;
	--force) force=1; shift ;;
	--kubeconfig) kubeconfig=$2; shift 2 ;;
	--allocation-key) key=$2; shift 2 ;;
	--plugin-option) check_option "$2"; args+=("--plugin-option=$2"); shift 2 ;;
	--gpu-allowlist) allowlist=$2; shift 2 ;;
	--module)
		case $2 in
		'' | *[!A-Za-z0-9_.-]*) echo "install.sh: --module $2: a module name is letters, digits, '.', '_' and '-'" >&2; exit 2 ;;
		esac
		modules+=("$2"); shift 2 ;;
	--kubelet-config) kubelet_config=$2; shift 2 ;;
	--kubelet-flags) kubelet_flags=$2; shift 2 ;;
	--from) src=$(cd "$2" && pwd); shift 2 ;;
	--no-preflight) preflight=0; shift ;;
	--no-resource-slices) args+=("--publish-resource-slices=false"); shift ;;
	*) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || die "run as root"

# Swapping, and rolling back. swap_in NEW DST puts NEW (a file, link or
# directory beside DST) in DST's place by rename, keeping what was there as
# DST.kubegpu-old, and logs it in `swapped`. While `armed` is 1 a failure
# (any non-zero exit: set -e, die) rolls back every swap, newest first;
# commit drops the kept copies once everything is in place.
changed=0 armed=0 reloaded=0
swapped=()
swap_in() {
	local new=$1 dst=$2
	rm -rf "$dst.kubegpu-old"
	if [ -d "$dst" ] && [ ! -L "$dst" ]; then
		# A directory cannot be replaced by one rename: move it aside.
		mv -T "$dst" "$dst.kubegpu-old"
		swapped+=("$dst")
		mv -T "$new" "$dst"
	elif [ -e "$dst" ] || [ -L "$dst" ]; then
		cp -a "$dst" "$dst.kubegpu-old"
		swapped+=("$dst")
		mv -T "$new" "$dst"
	else
		swapped+=("$dst")
		mv -T "$new" "$dst"
	fi
	changed=1
	fail_after "$dst"
}
# fail_after DST fails where KUBEGPU_INSTALL_FAIL_AFTER (tests only) asks.
fail_after() {
	[ -n "${KUBEGPU_INSTALL_FAIL_AFTER:-}" ] || return 0
	# shellcheck disable=SC2254 # a pattern, on purpose
	case ${1#"$R"} in
	$KUBEGPU_INSTALL_FAIL_AFTER) die "failing after ${1#"$R"} as KUBEGPU_INSTALL_FAIL_AFTER asks (tests only)" ;;
	esac
}
# take_out DST moves DST aside (kept until commit), logged as a swap.
take_out() {
	local dst=$1
	[ -e "$dst" ] || [ -L "$dst" ] || return 0
	rm -rf "$dst.kubegpu-old"
	mv -T "$dst" "$dst.kubegpu-old"
	swapped+=("$dst")
	changed=1
	fail_after "$dst"
}
rollback() {
	set +e
	local i dst
	for ((i = ${#swapped[@]} - 1; i >= 0; i--)); do
		dst=${swapped[i]}
		if [ -e "$dst.kubegpu-old" ] || [ -L "$dst.kubegpu-old" ]; then
			if [ -d "$dst.kubegpu-old" ] && [ ! -L "$dst.kubegpu-old" ]; then
				rm -rf "$dst"
			elif [ -d "$dst" ] && [ ! -L "$dst" ]; then
				rm -rf "$dst"
			fi
			mv -T "$dst.kubegpu-old" "$dst"
		else
			rm -rf "$dst"
		fi
	done
	[ "$reloaded" = 0 ] || $SYSTEMCTL daemon-reload
	echo "install.sh: failed; rolled back ${#swapped[@]} swapped path(s): the node has the files it had before" >&2
}
commit() {
	local dst
	for dst in "${swapped[@]}"; do
		rm -rf "$dst.kubegpu-old"
	done
	armed=0
}
stage=
on_exit() {
	local rc=$?
	[ -z "$stage" ] || rm -rf "$stage"
	if [ "$rc" != 0 ] && [ "$armed" = 1 ]; then
		rollback
	fi
}
trap on_exit EXIT

# put MODE SRC DST installs SRC as DST (root's, MODE) by swap_in, unless
# DST already is that.
put() {
	local mode=$1 from=$2 to=$3
	if [ -f "$to" ] && [ ! -L "$to" ] && cmp -s "$from" "$to" && [ "$(stat -c '%a %u' "$to")" = "${mode#0} 0" ]; then
		return 0
	fi
	install -D -o root -g root -m "$mode" "$from" "$to.kubegpu-new"
	swap_in "$to.kubegpu-new" "$to"
}
# link TARGET DST makes DST a symbolic link to TARGET by swap_in, unless it
# already is one.
link() {
	local target=$1 dst=$2
	if [ -L "$dst" ] && [ "$(readlink "$dst")" = "$target" ]; then
		return 0
	fi
	install -d -m 0755 "$(dirname "$dst")"
	rm -rf "$dst.kubegpu-new"
	ln -s "$target" "$dst.kubegpu-new"
	swap_in "$dst.kubegpu-new" "$dst"
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

# word ARG is ARG as one word of $KUBEGPU_CRISHIM_ARGS. systemd splits an
# unbraced $VAR of ExecStart= at white space, removing '...' and "..."
# quotes, and a backslash takes the next character literally, inside
# quotes too: a word with anything but plain characters is single-quoted
# with its backslashes and single quotes escaped.
word() {
	local s=$1
	case $s in
	*[!A-Za-z0-9_./:=,+@%-]*)
		s=${s//\\/\\\\}
		s=${s//\'/\\\'}
		printf "'%s'" "$s" ;;
	*) printf '%s' "$s" ;;
	esac
}
# env_line NAME WORD... is an EnvironmentFile line setting NAME to the
# words. A "..." value of an EnvironmentFile keeps every character but
# takes a backslash before " or \ as escaping it; newlines never get here
# (check_option).
env_line() {
	local name=$1 value='' w s
	shift
	for w in "$@"; do
		value+="${value:+ }$(word "$w")"
	done
	s=${value//\\/\\\\}
	s=${s//\"/\\\"}
	printf '%s="%s"\n' "$name" "$s"
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

# kubelet_elsewhere says whether kubelet's own files show that it does not
# talk to the shim: none of them names the shim's socket, and the flags
# (which win) or else the configuration set another endpoint. It sets
# `evidence` to what it found.
evidence=
kubelet_elsewhere() {
	local f v flags=() configs=()
	[ -z "$kubelet_flags" ] || flags+=("$R$kubelet_flags")
	flags+=("$R/var/lib/kubelet/kubeadm-flags.env" "$R/etc/default/kubelet" "$R/etc/sysconfig/kubelet"
		"$R"/etc/systemd/system/kubelet.service.d/*.conf "$R"/usr/lib/systemd/system/kubelet.service.d/*.conf
		"$R"/lib/systemd/system/kubelet.service.d/*.conf)
	[ -z "$kubelet_config" ] || configs+=("$R$kubelet_config")
	configs+=("$R/var/lib/kubelet/config.yaml")
	for f in "${flags[@]}" "${configs[@]}"; do
		if [ -f "$f" ] && grep -q -F "${endpoint#unix://}" "$f"; then
			evidence="${f#"$R"} names the shim's socket"
			return 1
		fi
	done
	for f in "${flags[@]}"; do
		[ -f "$f" ] || continue
		v=$(flag_value "$f")
		if [ -n "$v" ]; then
			evidence="${f#"$R"} sets --container-runtime-endpoint=$v"
			return 0
		fi
	done
	for f in "${configs[@]}"; do
		[ -f "$f" ] || continue
		v=$(grep -m1 '^containerRuntimeEndpoint:' "$f" || true)
		if [ -n "$v" ]; then
			evidence="${f#"$R"} sets $v"
			return 0
		fi
	done
	evidence="no --container-runtime-endpoint or containerRuntimeEndpoint found in kubelet's usual files"
	return 1
}

if [ "$uninstall" = 1 ]; then
	if [ -f "$unit_dst" ] || [ -e "$bin_dst" ] || [ -L "$bin_dst" ]; then
		if [ ! -f "$restore/kubelet-config" ] && [ ! -f "$restore/kubelet-flags" ]; then
			if kubelet_elsewhere; then
				say "kubelet does not talk to the shim ($evidence)"
			elif [ "$force" = 1 ]; then
				say "--force: removing the shim and leaving kubelet's endpoint as it is ($evidence): if kubelet talks to $endpoint, point its --container-runtime-endpoint back at containerd and restart it, or the node stays NotReady"
			else
				die "refusing to uninstall: install.sh did not set kubelet's endpoint (no record under /etc/kubegpu/restore), and kubelet may still talk to the shim ($evidence); removing the shim would leave kubelet on a dead socket and the node NotReady. Point kubelet's --container-runtime-endpoint (or containerRuntimeEndpoint) back at containerd and restart kubelet, then run --uninstall again (give --kubelet-config/--kubelet-flags if kubelet's files are elsewhere). --force removes the shim anyway and leaves kubelet's endpoint as it is, for you to fix by hand."
			fi
		fi
	fi
	restore_kubelet
	if [ "$kubelet_changed" = 1 ]; then
		$SYSTEMCTL restart kubelet
	fi
	if [ -f "$unit_dst" ]; then
		$SYSTEMCTL disable --now kubegpu-crishim
	fi
	# The node's ResourceSlices and its GPUs on the Node, with its own
	# credentials; the slices also go when the Node is deleted.
	if [ -x "$bin_dst" ] && [ -e "$etc/kubeconfig" ]; then
		if ! timeout 60 "$bin_dst" unpublish --kubeconfig "$etc/kubeconfig"; then
			say "could not remove this node's ResourceSlices (driver gpu.kubegpu.io) or its GPUs on the Node; remove the slices with: kubectl delete resourceslices --field-selector spec.driver=gpu.kubegpu.io,spec.nodeName=$(hostname | tr 'A-Z' 'a-z'), and run kubegpu-crishim unpublish with an administrator's kubeconfig for the rest"
		fi
	fi
	remove "$unit_dst" "$args_dst" "$bin_dst" "$lib" "$etc"
	if [ "$changed" = 1 ]; then
		$SYSTEMCTL daemon-reload
		say "kubegpu-crishim uninstalled"
	else
		say "kubegpu-crishim is not installed; nothing to do"
	fi
	exit 0
fi

{ [ -n "$kubeconfig" ] && [ -f "$kubeconfig" ]; } || { echo "install.sh: --kubeconfig FILE is required (the node's own credentials, kubelet's kubeconfig, e.g. /etc/kubernetes/kubelet.conf)" >&2; exit 2; }
{ [ -n "$key" ] && [ -f "$key" ]; } || { echo "install.sh: --allocation-key FILE is required (the scheduler's Ed25519 public key(s), PEM)" >&2; exit 2; }
[ -z "$allowlist" ] || [ -f "$allowlist" ] || die "--gpu-allowlist $allowlist: no such file"
bin=$src/bin/kubegpu-crishim
[ -x "$bin" ] || die "$bin missing; run make build plugins"
[ ${#modules[@]} -gt 0 ] || modules=(nvidia)
for m in "${modules[@]}"; do
	[ -f "$src/plugins/$m.so" ] || die "device module $src/plugins/$m.so missing; run make plugins (modules built: $(cd "$src/plugins" 2>/dev/null && find . -maxdepth 1 -name '*.so' -printf '%f '))"
done
old_version=$("$bin_dst" version 2>/dev/null || echo none)
new_version=$("$bin" version)

# 1. Stage: the whole release in a directory beside the installed ones,
# the modules pinned. Nothing installed is touched yet.
install -d -o root -g root -m 0755 "$lib" "$releases"
stage=$releases/.stage-$$
rm -rf "$stage"
install -d -o root -g root -m 0755 "$stage" "$stage/plugins"
install -o root -g root -m 0755 "$bin" "$stage/kubegpu-crishim"
for m in "${modules[@]}"; do
	install -o root -g root -m 0644 "$src/plugins/$m.so" "$stage/plugins/$m.so"
	args+=("--plugin-sha256=$m.so=$(sha256sum "$stage/plugins/$m.so" | cut -d' ' -f1)")
done
if [ -n "$allowlist" ]; then
	args+=("--gpu-allowlist=/etc/kubegpu/gpu-allowlist.yaml")
fi
if [ "$preflight" = 1 ]; then
	pre=("--plugin-dir=$stage/plugins")
	for a in "${args[@]}"; do
		case $a in --plugin-option=* | --plugin-sha256=*) pre+=("$a") ;; esac
	done
	if ! out=$("$stage/kubegpu-crishim" devices "${pre[@]}" 2>&1); then
		printf '%s\n' "$out" >&2
		running="$old_version keeps running"
		[ "$old_version" != none ] || running="nothing was installed"
		die "the new build's device modules do not load on this node (above); nothing was changed: $running"
	fi
fi
# The release's ID is the digest of its binary, modules and options; the
# options name its plugin directory, so they are written once the ID is
# known, from the digest of the rest.
id=$(cd "$stage" && find . -type f -print0 | sort -z | xargs -0 sha256sum | { cat; printf '%s\0' "${args[@]}"; } | sha256sum | cut -c1-16)
env_line KUBEGPU_CRISHIM_ARGS "--plugin-dir=${releases#"$R"}/$id/plugins" "${args[@]}" > "$stage/kubegpu-crishim.env"
chmod 0644 "$stage/kubegpu-crishim.env"
release=$releases/$id

# 2. Swap, in this order, every step a rename (swap_in), rolled back as a
# whole if any later step fails, up to and including `systemctl enable`:
#   a. the release directory (new; nothing runs it yet);
#   b. the key, the allowlist and the kubeconfig link, which every
#      release reads by the same path;
#   c. `current` -> the release: the commit point. Binary, modules, pins and
#      options change together, by one rename;
#   d. the links through `current` (on the first install, or from the
#      layout before releases): the options file first, the binary last;
#      only here can a shim restarting in between see an old binary with
#      new modules, which it refuses, saying so, until the restart below;
#   e. an allowlist no longer given goes, now that the options no longer
#      name it, and so does the modules' directory of the old layout;
#   f. the unit, then daemon-reload and enable.
# The shim is (re)started once all of it is in place.
armed=1
if [ "$(readlink "$current" 2>/dev/null || true)" = "releases/$id" ] && [ -d "$release" ] && diff -r -q "$stage" "$release" >/dev/null 2>&1; then
	rm -rf "$stage"
else
	swap_in "$stage" "$release"
fi
stage=
install -d -m 0755 "$etc"
# Public keys may be read by anyone; a shared HMAC secret must not be.
keymode=0644
grep -q 'KUBEGPU HMAC-SHA256 SECRET' "$key" && keymode=0600
put "$keymode" "$key" "$etc/allocation-key.pub.pem"
[ -z "$allowlist" ] || put 0644 "$allowlist" "$etc/gpu-allowlist.yaml"
link "$(readlink -f "$kubeconfig")" "$etc/kubeconfig"
link "releases/$id" "$current"
link "${current}/kubegpu-crishim.env" "$args_dst"
link "${current}/kubegpu-crishim" "$bin_dst"
[ -n "$allowlist" ] || take_out "$etc/gpu-allowlist.yaml"
take_out "$old_plugin_dst"
files_changed=$changed
changed=0
put 0644 "$unit_src" "$unit_dst"
if [ "$changed" = 1 ]; then
	reloaded=1
	$SYSTEMCTL daemon-reload
fi
[ "$files_changed" = 0 ] || changed=1
$SYSTEMCTL enable kubegpu-crishim
commit
# Releases other than this one: nothing runs them once the unit restarts.
for r in "$releases"/* "$releases"/.stage-*; do
	[ "$r" = "$release" ] || [ ! -e "$r" ] || rm -rf "$r"
done

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
