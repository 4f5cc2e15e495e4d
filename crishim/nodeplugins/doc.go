// Package nodeplugins starts the node side of every device module in a
// plugin directory. Open reports a broken installation (a .so that does not
// load, options for a missing module) as an error; skips, with a log line, a
// module that has no devices on this node (types.ErrNoDevices: e.g. NVIDIA
// without a driver); and reports a module that fails otherwise alongside the
// modules that started, for the caller to decide.
package nodeplugins
