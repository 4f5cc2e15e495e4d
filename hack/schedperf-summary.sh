#!/usr/bin/env bash
# Summarises bench-schedperf's rounds: per workload and node count, the
# mean SchedulingThroughput of kubegpu-scheduler's plugin and of the stock
# plugins, their range over the rounds, and the ratio of the means with
# the range of the per-round ratios.
set -euo pipefail
grep -hE '^Benchmark' "$@" | awk '
{
	for (i = 1; i < NF; i++) if ($(i+1) == "SchedulingThroughput/Average") v = $i
	split($1, p, "/"); sub(/-[0-9]+$/, "", p[3])
	split(p[2], w, "_"); sched = w[1]; key = w[2] "/" p[3]
	n[sched, key]++; sum[sched, key] += v; val[sched, key, n[sched, key]] = v
	if (!(key in seen)) { seen[key] = 1; keys[++k] = key }
}
function stat(s, key,    j, lo, hi) {
	lo = hi = val[s, key, 1]
	for (j = 2; j <= n[s, key]; j++) { if (val[s, key, j] < lo) lo = val[s, key, j]; if (val[s, key, j] > hi) hi = val[s, key, j] }
	return sprintf("%7.1f (%5.1f-%5.1f)", sum[s, key] / n[s, key], lo, hi)
}
END {
	printf "%-24s %6s %-22s %-22s %s\n", "workload", "rounds", "kubegpu pods/s", "stock pods/s", "ratio (per round)"
	for (i = 1; i <= k; i++) {
		key = keys[i]; r = ""; lo = 1e9; hi = 0
		for (j = 1; j <= n["KubeGPU", key] && j <= n["Stock", key]; j++) {
			q = val["KubeGPU", key, j] / val["Stock", key, j]; if (q < lo) lo = q; if (q > hi) hi = q
		}
		printf "%-24s %6d %-22s %-22s %.2fx (%.2f-%.2f)\n", key, n["KubeGPU", key], stat("KubeGPU", key), stat("Stock", key),
			(sum["KubeGPU", key] / n["KubeGPU", key]) / (sum["Stock", key] / n["Stock", key]), lo, hi
	}
}'
