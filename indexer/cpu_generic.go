//go:build !linux || !amd64

package indexer

// currentCPU returns the number of the CPU the calling thread runs on, or
// -1 if the system does not tell.
func currentCPU() int32 { return getcpu() }
