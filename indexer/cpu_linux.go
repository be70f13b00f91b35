package indexer

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// getcpu returns the number of the CPU the calling thread runs on, as the
// system call getcpu(2) tells it, or -1 if it does not.
func getcpu() int32 {
	var cpu uint32
	if _, _, errno := unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0); errno != 0 {
		return -1
	}
	return int32(cpu)
}
