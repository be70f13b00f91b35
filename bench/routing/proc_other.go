//go:build !unix

package main

import (
	"os"
	"syscall"
)

// sysProcAttr: no process groups here.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup kills the process: there is no SIGTERM to send.
func signalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
