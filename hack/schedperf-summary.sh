#!/usr/bin/env bash
# Summarises bench-schedperf's rounds (one file each): per workload and node
# count, the mean SchedulingThroughput of kubegpu-scheduler's plugin and of
# the stock plugins with their range over the rounds, and the ratio of the
# means with the range of the ratios of the rounds that have both.
set -euo pipefail
awk '
/^Benchmark/ {
	v = ""
	for (i = 1; i < NF; i++) if ($(i+1) == "SchedulingThroughput/Average") v = $i
	if (v == "") next
	split($1, p, "/"); sub(/-[0-9]+$/, "", p[3])
	split(p[2], w, "_"); sched = w[1]; key = w[2] "/" p[3]
	if (sched != "KubeGPU" && sched != "Stock") next
	val[sched, key, FILENAME] = v; has[sched, key, FILENAME] = 1
	n[sched, key]++; sum[sched, key] += v
	if (!(key in seen)) { seen[key] = 1; keys[++k] = key }
	if (!(FILENAME in round)) { round[FILENAME] = 1; files[++f] = FILENAME }
}
function stat(s, key,    j, lo, hi, x, first) {
	if (n[s, key] == 0) return sprintf("%-22s", "-")
	first = 1
	for (j = 1; j <= f; j++) if (has[s, key, files[j]]) {
		x = val[s, key, files[j]]
		if (first || x < lo) lo = x
		if (first || x > hi) hi = x
		first = 0
	}
	return sprintf("%7.1f (%5.1f-%5.1f)", sum[s, key] / n[s, key], lo, hi)
}
END {
	printf "%-24s %6s %-22s %-22s %s\n", "workload", "rounds", "kubegpu pods/s", "stock pods/s", "ratio (range over rounds)"
	for (i = 1; i <= k; i++) {
		key = keys[i]; pairs = 0; lo = hi = 0; ratio = "-"
		for (j = 1; j <= f; j++) if (has["KubeGPU", key, files[j]] && has["Stock", key, files[j]]) {
			q = val["KubeGPU", key, files[j]] / val["Stock", key, files[j]]
			if (pairs == 0 || q < lo) lo = q
			if (pairs == 0 || q > hi) hi = q
			pairs++
		}
		if (pairs > 0) ratio = sprintf("%.2fx (%.2f-%.2f)", (sum["KubeGPU", key] / n["KubeGPU", key]) / (sum["Stock", key] / n["Stock", key]), lo, hi)
		printf "%-24s %6d %s %s %s\n", key, pairs, stat("KubeGPU", key), stat("Stock", key), ratio
	}
}' "$@"
