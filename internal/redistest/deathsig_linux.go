package redistest

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel SIGKILL the server if the test process
// dies without its cleanup (a mutation run's timeout kills the test
// binary), so no redis-server or redis-sentinel outlives it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
