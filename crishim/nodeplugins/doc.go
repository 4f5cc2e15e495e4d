// Package nodeplugins starts the node side of every device module in a
// plugin directory. Open returns the modules that started and a Failure
// for each that did not (a .so that does not load, a node side that does
// not start) or for the whole directory (missing or untrusted, options
// for a module that is not there), so that the shim serves with the
// others and reports the rest; it skips, with a log line, a module that
// has no devices on this node (types.ErrNoDevices: e.g. NVIDIA without a
// driver).
package nodeplugins
