#!/usr/bin/env bash
# Summarises bench-schedperf's rounds (one file each): per workload and node
# count, the mean SchedulingThroughput of kubegpu-scheduler's plugin and of
# the stock plugins with their range and number of rounds, and the ratio of
# the two means over the rounds that have both (paired), with the range of
# those rounds' own ratios. A round file with a workload twice counts its
# last line. Then, from the scheduler's log, the nodes each scheduler
# evaluated per pod bound, the pods created before the measured ones
# included (Filter's pass over the nodes stops once it has found enough
# feasible ones: full nodes make it look further). Last, the CPU each test
# case took, whole (nodes, pods before and measured pods, the harness's
# metrics): the test process's (API server, scheduler, harness) and the
# machine's other (etcd, anything else running), and the CPU the host stole
# from the machine; more CPU for the same case in one round than in another
# is the machine's noise. Test cases other than
# KubeGPU_* and Stock_* (StockBinpack_*) are left out; SCHEDPERF_A=Control
# pairs Control_* with Stock_* instead of KubeGPU_* (hack/schedperf-duet.sh
# -a Control). SCHEDPERF_DUET=1 (duets, where the two cases ran at once):
# the machine's other CPU is mostly the other case's, so it is not shown.
set -euo pipefail
awk -v A="${SCHEDPERF_A:-KubeGPU}" -v duet="${SCHEDPERF_DUET:-0}" '
FNR == 1 { cur = "" }
/^# kubegpu-scheduler gpuMetrics: / { mode[$4] = 1; next }
/^# kubegpu-scheduler nodePolicy: / { policy[$4] = 1; next }
/^# kubegpu-scheduler podsWithoutDevices: / { without[$4] = 1; next }
/logger="BenchmarkPerfScheduling\/[A-Za-z]+_[A-Za-z0-9]+\/[0-9]+Nodes/ && !/evaluatedNodes=/ {
	match($0, /BenchmarkPerfScheduling\/[A-Za-z]+_[A-Za-z0-9]+\/[0-9]+Nodes/)
	split(substr($0, RSTART, RLENGTH), c, "/"); split(c[2], cw, "_")
	cur = cw[1] SUBSEP cw[2] "/" c[3]
	next
}
/evaluatedNodes=[0-9]+/ && cur != "" {
	match($0, /evaluatedNodes=[0-9]+/)
	evals[cur] += substr($0, RSTART + 15, RLENGTH - 15); bound[cur]++
	next
}
/^BenchmarkPerfScheduling\/[A-Za-z]+_[A-Za-z0-9]+\/[0-9]+Nodes: after: / {
	split($1, c, "/"); split(c[2], cw, "_"); sub(/:$/, "", c[3])
	ck = cw[1] SUBSEP cw[2] "/" c[3]
	if (match($0, /process [0-9.]+ CPU-s/)) { split(substr($0, RSTART, RLENGTH), xs, " "); proc[ck] += xs[2]; cases[ck]++
		cpul[ck] = cpul[ck] (cpul[ck] == "" ? "" : " ") sprintf("%.0f", xs[2]) }
	if (match($0, /machine busy [0-9.]+ CPU-s/)) { split(substr($0, RSTART, RLENGTH), xs, " "); busy[ck] += xs[3]; machine[ck]++ }
	if (match($0, /steal [0-9.]+/)) { split(substr($0, RSTART, RLENGTH), xs, " "); steal[ck] += xs[2] }
	next
}
/^Benchmark/ {
	v = ""
	for (i = 1; i < NF; i++) if ($(i+1) == "SchedulingThroughput/Average") v = $i
	if (v == "") next
	split($1, p, "/"); sub(/-[0-9]+$/, "", p[3])
	split(p[2], w, "_"); sched = w[1]; key = w[2] "/" p[3]
	if (sched != A && sched != "Stock") next
	val[sched, key, FILENAME] = v; has[sched, key, FILENAME] = 1
	if (!(key in seen)) { seen[key] = 1; keys[++k] = key }
	if (!(FILENAME in round)) { round[FILENAME] = 1; files[++f] = FILENAME }
}
function stat(s, key,    j, lo, hi, x, n, sum) {
	n = 0; sum = 0
	for (j = 1; j <= f; j++) if (has[s, key, files[j]]) {
		x = val[s, key, files[j]]
		if (n == 0 || x < lo) lo = x
		if (n == 0 || x > hi) hi = x
		n++; sum += x
	}
	if (n == 0) return sprintf("%-26s", "-")
	return sprintf("%-26s", sprintf("%7.1f (%5.1f-%5.1f) [%d]", sum / n, lo, hi, n))
}
END {
	m = ""
	for (x in mode) m = m (m == "" ? "" : ", ") x
	if (m != "") printf "kubegpu-scheduler with gpuMetrics: %s\n", m
	m = ""
	for (x in policy) m = m (m == "" ? "" : ", ") x
	if (m != "") printf "kubegpu-scheduler with nodePolicy: %s\n", m
	m = ""
	for (x in without) m = m (m == "" ? "" : ", ") x
	if (m != "") printf "kubegpu-scheduler with podsWithoutDevices: %s\n", m
	printf "%-24s %6s %-26s %-26s %s\n", "workload", "paired", tolower(A) " pods/s [rounds]", "stock pods/s [rounds]", "ratio of paired means (range over rounds)"
	for (i = 1; i <= k; i++) {
		key = keys[i]; pairs = 0; lo = hi = 0; sk = ss = 0; ratio = "-"
		for (j = 1; j <= f; j++) if (has[A, key, files[j]] && has["Stock", key, files[j]] && val["Stock", key, files[j]] > 0) {
			a = val[A, key, files[j]]; b = val["Stock", key, files[j]]
			q = a / b
			if (pairs == 0 || q < lo) lo = q
			if (pairs == 0 || q > hi) hi = q
			sk += a; ss += b; pairs++
		}
		if (pairs > 0) ratio = sprintf("%.2fx (%.2f-%.2f)", sk / ss, lo, hi)
		printf "%-24s %6d %s %s %s\n", key, pairs, stat(A, key), stat("Stock", key), ratio
	}
	printf "\n%-24s %-22s %s\n", "workload", tolower(A) " nodes/pod", "stock nodes/pod (evaluated per pod bound, all rounds)"
	for (i = 1; i <= k; i++) {
		key = keys[i]
		printf "%-24s %-22s %s\n", key, \
			(bound[A, key] ? sprintf("%.0f", evals[A, key] / bound[A, key]) : "-"), \
			(bound["Stock", key] ? sprintf("%.0f", evals["Stock", key] / bound["Stock", key]) : "-")
	}
	printf "\n%-24s %-9s %s\n", "workload", "scheduler", "CPU-s per test case: process mean (each round), other, stolen" \
		(duet == 1 ? " (duets: other is the other case'"'"'s, not shown)" : "")
	for (i = 1; i <= k; i++) for (sc = 1; sc <= 2; sc++) {
		key = keys[i]; s = (sc == 1 ? A : "Stock")
		if (!cases[s, key]) continue
		# Other and stolen only where every case read /proc/stat.
		if (duet == 1 && machine[s, key] == cases[s, key])
			printf "%-24s %-9s %.1f (%s), -, %.1f\n", key, s, proc[s, key] / cases[s, key], cpul[s, key], steal[s, key] / cases[s, key]
		else if (machine[s, key] == cases[s, key])
			printf "%-24s %-9s %.1f (%s), %.1f, %.1f\n", key, s, proc[s, key] / cases[s, key], cpul[s, key], \
				(busy[s, key] - proc[s, key]) / cases[s, key], steal[s, key] / cases[s, key]
		else
			printf "%-24s %-9s %.1f (%s), -, -\n", key, s, proc[s, key] / cases[s, key], cpul[s, key]
	}
}' "$@"
