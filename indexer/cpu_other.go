//go:build !linux

package indexer

// currentCPU returns -1: the system does not tell which CPU a thread runs
// on.
func currentCPU() int32 { return -1 }
