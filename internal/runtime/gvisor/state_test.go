package gvisor

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A process that exited but is not reaped yet (a zombie) is not alive,
// though signal 0 still reaches it; one that is gone is not alive either.
func TestProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !processAlive(pid) {
		t.Error("a running process is not alive")
	}
	cmd.Process.Kill()
	for deadline := time.Now().Add(10 * time.Second); processAlive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a killed process, not reaped, still counts as alive")
		}
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the zombie should still take signal 0: %v", err)
	}
	cmd.Wait()
	if processAlive(pid) {
		t.Error("a reaped process is alive")
	}
}
