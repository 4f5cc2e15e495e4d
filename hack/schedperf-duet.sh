#!/usr/bin/env bash
# Runs scheduler_perf test cases in duets: kubegpu-scheduler's test case and
# the stock scheduler's for the same workload at the same time, in two test
# processes, each pinned (with its etcd) to its own half of the CPUs, the
# halves swapped every round. On a shared virtual machine the CPU's speed
# drifts from one minute to the next; run side by side, both schedulers
# see the same drift, so their ratio varies far less than that of cases
# run one after the other (duet benchmarking, Bulej et al., ICPE 2020).
# The pods/s of each are those of half the machine: compare the ratio, not
# the rates, with sequential runs.
#
#   schedperf-duet.sh -t TEST -o DIR [-r ROUNDS] [-n NODES] [-l LABELS] [-a KubeGPU|Control] WORKLOAD...
#
# TEST is the schedperf test binary (run from test/schedperf, where its
# templates are); the environment it needs (PATH with etcd,
# KUBEGPU_PLUGIN_DIR, ...) passes through. NODES is the harness's workload
# (5000Nodes, or 500Nodes with LABELS short); LABELS its label filter.
# Round r writes DIR/round-r.txt,
# both cases' output one after the other, for hack/schedperf-summary.sh.
# -a Control runs the stock plugins on both sides (an A/A duet): how far
# two runs of the same scheduler differ side by side.
set -euo pipefail

usage() {
	echo "usage: $0 -t TEST -o DIR [-r ROUNDS] [-n NODES] [-l LABELS] [-a KubeGPU|Control] WORKLOAD..." >&2
	exit 2
}

test_bin= out= rounds=2 nodes=5000Nodes labels=performance a=KubeGPU
while getopts t:o:r:n:l:a: opt; do
	case $opt in
	t) test_bin=$OPTARG ;;
	o) out=$OPTARG ;;
	r) rounds=$OPTARG ;;
	n) nodes=$OPTARG ;;
	l) labels=$OPTARG ;;
	a) a=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[[ -n $test_bin && -n $out && $# -gt 0 ]] || usage
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "$0: -r $rounds: want a positive number" >&2; exit 2; }
case $a in
KubeGPU | Control) ;;
*) echo "$0: -a $a: want KubeGPU or Control" >&2; exit 2 ;;
esac
for w in "$@"; do
	[[ $w =~ ^[A-Za-z0-9]+$ ]] || { echo "$0: workload $w: want a name such as WholeGPU" >&2; exit 2; }
done
[[ $nodes =~ ^[0-9]+Nodes$ ]] || { echo "$0: -n $nodes: want a node count such as 5000Nodes" >&2; exit 2; }
if ((rounds % 2)); then
	echo "$0: warning: $rounds rounds: one side runs on the first half of the CPUs once more than the other" >&2
fi
command -v taskset >/dev/null || { echo "$0: needs taskset (util-linux)" >&2; exit 1; }

# The CPUs this script may use (its affinity, as "0-3,8"), split in halves.
cpus=()
IFS=, read -ra ranges <<<"$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)"
for r in "${ranges[@]}"; do
	lo=${r%-*} hi=${r#*-}
	for ((c = lo; c <= hi; c++)); do cpus+=("$c"); done
done
half=$((${#cpus[@]} / 2))
if ((half < 1)); then
	echo "$0: needs at least 2 CPUs, has ${#cpus[@]}" >&2
	exit 1
fi
first=$(IFS=,; echo "${cpus[*]:0:half}")
second=$(IFS=,; echo "${cpus[*]:half:half}")

mkdir -p "$out"
rm -rf "$out"/round-*.txt "$out"/duet-*.txt "$out"/items-*

# Each side runs in a process group of its own (the test and the etcd it
# starts), stopped with the script and when the other side fails.
pids=()
stop_sides() {
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
}
trap 'stop_sides' EXIT
trap 'stop_sides; exit 130' INT
trap 'stop_sides; exit 143' TERM
for ((r = 1; r <= rounds; r++)); do
	if ((r % 2)); then acpus=$first scpus=$second; else acpus=$second scpus=$first; fi
	for w in "$@"; do
		pids=()
		for side in "$a:$acpus" "Stock:$scpus"; do
			sched=${side%%:*} set=${side#*:}
			items=$out/items-$r-$w-$sched
			mkdir -p "$items"
			KUBEGPU_SCHEDPERF_CONTROL=$([[ $sched == Control ]] && echo 1 || echo 0) \
				setsid taskset -c "$set" "$test_bin" -test.run '^$' -test.bench "BenchmarkPerfScheduling/^${sched}_${w}\$/^${nodes}\$" \
				-test.benchtime 1x -test.timeout 180m -perf-scheduling-label-filter="$labels" -data-items-dir="$items" \
				>"$out/duet-$r-$w-$sched.txt" 2>&1 &
			pids+=($!)
		done
		failed=0
		for _ in "${pids[@]}"; do
			if ! wait -n; then
				failed=1
				stop_sides
				wait || true
				break
			fi
		done
		pids=()
		cat "$out/duet-$r-$w-$a.txt" "$out/duet-$r-$w-Stock.txt" >>"$out/round-$r.txt"
		if ((failed)); then
			echo "$0: round $r, $w failed: see $out/duet-$r-$w-*.txt" >&2
			exit 1
		fi
		for f in "$out/duet-$r-$w-$a.txt" "$out/duet-$r-$w-Stock.txt"; do
			if ! grep -qE '^Benchmark.*SchedulingThroughput/Average' "$f"; then
				echo "$0: round $r, $w: no SchedulingThroughput in $f (is there such a workload with -n $nodes -l $labels, and a test binary with Control_* cases for -a Control?)" >&2
				exit 1
			fi
		done
		grep -hE '^Benchmark' "$out/duet-$r-$w-$a.txt" "$out/duet-$r-$w-Stock.txt" |
			awk -v r="$r" '{for (i = 1; i < NF; i++) if ($(i+1) == "SchedulingThroughput/Average") print "round", r, $1, $i, "pods/s"}'
	done
	echo "round $r: $a on CPUs $acpus, Stock on CPUs $scpus"
done
SCHEDPERF_A=$a SCHEDPERF_DUET=1 "$(dirname "$0")/schedperf-summary.sh" "$out"/round-*.txt
