package indexer

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// currentCPU returns the number of the CPU the calling thread runs on
// (getcpu(2)), or -1 if the system does not tell.
func currentCPU() int32 {
	var cpu uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return -1
	}
	return int32(cpu)
}
