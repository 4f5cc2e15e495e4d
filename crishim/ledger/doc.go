// Package ledger is the node's record of which devices live containers
// hold, kept in the container runtime itself: kubegpu-crishim labels every
// container it gives devices with its pod's UID and annotates it with the
// devices, and before giving devices to a new container it lists the
// runtime's labelled containers and refuses one whose devices another
// pod's live container holds (an exclusive device twice, or slices over a
// device's memory or compute). Nothing is kept on disk, so a restarted
// shim knows all its predecessor knew; containers created before the
// ledger existed, or by something other than the shim, are not in it.
package ledger
