//go:build !linux

package indexer

// getcpu returns -1: the system does not tell which CPU a thread runs on.
func getcpu() int32 { return -1 }
