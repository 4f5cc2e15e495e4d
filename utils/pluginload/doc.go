// Package pluginload loads kubegpu device modules from .so files built with
// go build -buildmode=plugin.
//
// Go can only load a plugin built by the same toolchain, with the same build
// settings and the same source of every package it shares with the host.
// When any of that differs, the runtime refuses with a terse message, or not
// at all until a symbol is used. Open therefore compares the plugin's build
// info with the host's before it calls plugin.Open and reports any
// difference as a *MismatchError that names the plugin, what differs and the
// fix (rebuild both with "make build plugins"). It never logs and continues:
// a plugin that does not load is an error for the caller to act on.
//
// Loading a plugin is process-global in Go (a .so is loaded once and never
// unloaded); the functions here are safe to call from one goroutine at a time.
package pluginload
