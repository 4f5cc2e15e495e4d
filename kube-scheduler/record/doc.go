// Package record writes kubegpu-scheduler's records of allocations: for
// each GPU pod bound with its signed allocation, the same payload in the
// pod's status (condition kubegpu.io/Allocated), which its tenant cannot
// change. The device cache asks for records (Add, AddUrgent) from its
// informer handlers; the Recorder's own workers write them, off the
// scheduling path and on a client of their own.
package record
