// Package tracepods turns a GPU cluster trace's pods (the openb format of
// device-scheduler/sim) into Kubernetes pods that ask for their GPUs as
// kubegpu's users do, for the runs that replay a trace through a real API
// server: the trace replay (test/replay) and the soak (test/soak).
package tracepods
