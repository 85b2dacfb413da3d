package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel SIGKILL the child if this process dies
// without cleaning up (a crash, SIGKILL), so no replica or redis-server
// outlives the command.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
