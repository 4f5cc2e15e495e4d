package nvmltest

// MPSControlStandIn is a shell script that stands in for
// nvidia-cuda-mps-control where there is no GPU. With -f it is the daemon,
// in the foreground: it makes a control FIFO in its pipe directory, writes
// whoami there (the pipe directory's host path) and mps-daemon in its
// /dev/shm, appends a line to standin.log beside the script with what it
// was started with (its GPUs, its default limits), and serves commands
// until quit, logging each. Without -f it is the client: it answers the
// commands that read and set the defaults as the real one does (an active
// thread percentage as "25.0", a pinned memory limit set through the pipe
// as "4G" or "2048M", one taken from the daemon's environment not at all;
// no servers), from state files in the pipe directory, and sends its
// other input to the daemon. With no daemon it fails, as the real one.
const MPSControlStandIn = `#!/bin/sh
log="$(dirname "$0")/standin.log"
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-f" ]; then
	mkfifo "$pipe/control" || exit 1
	echo "$pipe" > "$pipe/whoami"
	echo "$pipe" > /dev/shm/mps-daemon
	echo "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" > "$pipe/.threads"
	echo "start $pipe devices=$CUDA_VISIBLE_DEVICES threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE pinned=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" >> "$log"
	while read -r cmd < "$pipe/control"; do
		echo "$cmd $pipe" >> "$log"
		[ "$cmd" = quit ] && break
	done
	rm -f "$pipe/control"
	exit 0
fi
if [ ! -p "$pipe/control" ]; then
	echo "Cannot find MPS control daemon process" >&2
	exit 1
fi
read -r cmd a b
case "$cmd" in
get_default_active_thread_percentage)
	t=$(cat "$pipe/.threads" 2>/dev/null); echo "${t:-100}.0" ;;
set_default_active_thread_percentage)
	echo "$a" > "$pipe/.threads"; echo "$a.0" ;;
set_default_device_pinned_mem_limit)
	v=${b%M}
	if [ "$v" != "$b" ] && [ "$v" -ge 1024 ]; then b="$((v / 1024))G"; fi
	echo "$b" > "$pipe/.pinned-$a" ;;
get_default_device_pinned_mem_limit)
	cat "$pipe/.pinned-$a" 2>/dev/null ;;
get_server_list)
	cat "$pipe/.servers" 2>/dev/null ;;
get_active_thread_percentage)
	t=$(cat "$pipe/.server-$a-threads" 2>/dev/null || cat "$pipe/.threads" 2>/dev/null); echo "${t:-100}.0" ;;
set_active_thread_percentage)
	echo "$b" > "$pipe/.server-$a-threads"; echo "$b.0" ;;
get_device_pinned_mem_limit)
	cat "$pipe/.server-$a-pinned-$b" 2>/dev/null || cat "$pipe/.pinned-$b" 2>/dev/null ;;
*)
	echo "$cmd" > "$pipe/control" ;;
esac
echo "$cmd $a $b" >> "$log"
`
