package indexer

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// rdpidOK tells whether currentCPU may read the CPU with RDPID: the
// processor has the instruction, and it names the CPU as getcpu does.
// It is found once, on first use (NewShardedIndex, for shards that read
// the CPU), not at every process's start, and never changes.
var rdpidOK = sync.OnceValue(rdpidWorks)

// currentCPU returns the number of the CPU the calling thread runs on, or
// -1 if the system does not tell. Where RDPID works, it reads the number
// from the processor, in a few nanoseconds: Linux keeps it, with the NUMA
// node above it (node<<12 | cpu), in each CPU's TSC_AUX register, as its
// own getcpu does in the vDSO. Else it makes the system call, which costs
// a hundred nanoseconds or more on a VM (see BenchmarkCurrentCPU).
func currentCPU() int32 {
	if rdpidOK() {
		return int32(rdpid() & 0xfff)
	}
	return getcpu()
}

// rdpidWorks reports whether the processor has RDPID (CPUID leaf 7, ECX
// bit 22) and, on a thread pinned in turn to each of up to two CPUs the
// process may use, it names the CPU as getcpu does: a hypervisor may
// offer the instruction and leave TSC_AUX unset. The pinned thread ends
// with its goroutine, so that no other goroutine runs on it.
func rdpidWorks() bool {
	if maxLeaf, _, _, _ := cpuid(0, 0); maxLeaf < 7 {
		return false
	}
	if _, _, ecx, _ := cpuid(7, 0); ecx&(1<<22) == 0 {
		return false
	}
	ok := make(chan bool)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		var allowed unix.CPUSet
		if unix.SchedGetaffinity(0, &allowed) != nil {
			ok <- false
			return
		}
		checked := 0
		for cpu := 0; cpu < len(allowed)*64 && checked < 2; cpu++ {
			if !allowed.IsSet(cpu) {
				continue
			}
			var one unix.CPUSet
			one.Set(cpu)
			if unix.SchedSetaffinity(0, &one) != nil || int(rdpid()&0xfff) != cpu || getcpu() != int32(cpu) {
				ok <- false
				return
			}
			checked++
		}
		ok <- checked > 0
	}()
	return <-ok
}

// rdpid returns the calling CPU's TSC_AUX register (RDPID); the processor
// must have the instruction.
func rdpid() uint64

// cpuid returns what the CPUID instruction does for leaf and subleaf.
func cpuid(leaf, subleaf uint32) (eax, ebx, ecx, edx uint32)
