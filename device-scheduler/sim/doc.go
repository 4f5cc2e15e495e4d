// Package sim replays GPU cluster traces through placement policies and
// measures how much of the cluster's GPU capacity they manage to allocate.
//
// It follows the experiment of the FGD paper ("Beware of Fragmentation:
// Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
// USENIX ATC 2023) on the Alibaba openb trace, as its simulator runs it:
// pods arrive in a seeded random order, the workload is inflated by random
// draws until 130% of the GPU capacity has arrived, nothing departs, a pod
// that fits nowhere fails, and allocation is recorded against arrived
// demand. Its baselines (random, dotproduct, gpuclustering, gpupacking,
// bestfit) and FGD are re-implemented from the paper and its artifact;
// the kubegpu policy is the allocation engine itself, run over the device
// modules and node inventories the caller gives (Devices): the package
// loads none. kubegpu-sim (cli/sim) gives it simulated GPUs.
//
// Trace parsing (ReadNodes, ReadPods) reports malformed input with the file,
// line and column at fault.
package sim
