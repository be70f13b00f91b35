//go:build !linux

package main

// osCPU returns -1: the system does not tell which CPU a thread runs on.
func osCPU() int32 { return -1 }
