// Package sotest holds the test that builds nvidia.so as "make plugins" does
// and loads it. It is a package of its own because Go cannot load a plugin
// into a test binary that links the plugin's main package, or the test
// variant of a package the plugin contains (both differ from the plugin's
// copies).
package sotest
