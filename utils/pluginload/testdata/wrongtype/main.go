// Package main exports NewModule with the wrong type.
package main

// NewModule has the right name and the wrong signature.
func NewModule() string { return "not a module" }

func main() {}
