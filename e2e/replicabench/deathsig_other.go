//go:build !linux

package main

import "os/exec"

// setDeathSignal: only Linux can tie a child's life to its parent's; here
// killAll at exit is all there is.
func setDeathSignal(*exec.Cmd) {}
