package indexer

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCurrentCPU pins the test's thread to each CPU it may run on in turn,
// and checks that currentCPU (and CurrentCPU), and the system call it
// falls back to, name that CPU.
func TestCurrentCPU(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatalf("sched_getaffinity: %v", err)
	}
	defer func() {
		if err := unix.SchedSetaffinity(0, &allowed); err != nil {
			t.Errorf("restore the thread's CPUs: %v", err)
		}
	}()
	pinned := 0
	for cpu := range 1024 {
		if !allowed.IsSet(cpu) {
			continue
		}
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Fatalf("pin to CPU %d: %v", cpu, err)
		}
		if got, sys, pub := currentCPU(), getcpu(), CurrentCPU(); got != int32(cpu) || sys != int32(cpu) || pub != int32(cpu) {
			t.Errorf("pinned to CPU %d: currentCPU %d, getcpu %d, CurrentCPU %d", cpu, got, sys, pub)
		}
		pinned++
	}
	if pinned == 0 {
		t.Fatal("the thread may run on no CPU")
	}
	t.Logf("%d CPUs", pinned)
}
