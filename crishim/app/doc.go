// Package app holds kubegpu-crishim's cobra commands: devices (discover and
// print this node's devices) and version. NewCommand builds the root command
// over options structs; only main exits.
package app
