//go:build linux

package indexer

// hasRDPID tells whether the processor has the RDPID instruction
// (CPUID leaf 7, ECX bit 22).
var hasRDPID = func() bool {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false
	}
	_, _, ecx, _ := cpuid(7, 0)
	return ecx&(1<<22) != 0
}()

// currentCPU returns the number of the CPU the calling thread runs on, or
// -1 if the system does not tell. Where the processor has RDPID, it reads
// the number from the processor, in a few nanoseconds: Linux keeps it,
// with the NUMA node above it (node<<12 | cpu), in each CPU's TSC_AUX
// register, as its own getcpu does in the vDSO. Else it makes the system
// call, which costs a hundred nanoseconds or more on a VM (see
// BenchmarkCurrentCPU).
func currentCPU() int32 {
	if hasRDPID {
		return int32(rdpid() & 0xfff)
	}
	return getcpu()
}

// rdpid returns the calling CPU's TSC_AUX register (RDPID); the processor
// must have the instruction.
func rdpid() uint64

// cpuid returns what the CPUID instruction does for leaf and subleaf.
func cpuid(leaf, subleaf uint32) (eax, ebx, ecx, edx uint32)
