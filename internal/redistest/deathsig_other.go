//go:build !linux

package redistest

import "os/exec"

// setDeathSignal: only Linux can tie a child's life to its parent's; a
// test's cleanup is all there is elsewhere.
func setDeathSignal(*exec.Cmd) {}
