// Package nodeplugins starts the node side of every device module in a
// plugin directory. Open reports a broken installation (a .so that does not
// load, options for a missing module) as an error, and a module that cannot
// serve this node alongside the modules that started, for the caller to
// decide.
package nodeplugins
