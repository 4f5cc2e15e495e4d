package nvmltest

// MPSControlStandIn is a shell script that stands in for
// nvidia-cuda-mps-control where there is no GPU. With -f it is the daemon,
// in the foreground: it makes a control FIFO in its pipe directory, writes
// whoami there (the pipe directory's host path) and mps-daemon in its
// /dev/shm, appends a line to standin.log beside the script with what it
// was started with (its GPUs, its default limits), and serves commands
// until quit, logging each. Without -f it is the client: it sends its standard
// input to the daemon.
const MPSControlStandIn = `#!/bin/sh
log="$(dirname "$0")/standin.log"
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-f" ]; then
	mkfifo "$pipe/control" || exit 1
	echo "$pipe" > "$pipe/whoami"
	echo "$pipe" > /dev/shm/mps-daemon
	echo "start $pipe devices=$CUDA_VISIBLE_DEVICES threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE pinned=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" >> "$log"
	while read -r cmd < "$pipe/control"; do
		echo "$cmd $pipe" >> "$log"
		[ "$cmd" = quit ] && break
	done
	rm -f "$pipe/control"
	exit 0
fi
cat > "$pipe/control"
`
