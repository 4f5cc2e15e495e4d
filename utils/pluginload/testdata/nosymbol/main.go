// Package main is a Go plugin that is not a device module.
package main

// Hello is some other symbol.
func Hello() string { return "hello" }

func main() {}
