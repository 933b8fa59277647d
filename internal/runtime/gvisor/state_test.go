package gvisor

import (
	"io/fs"
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

// TestCmdlineAlive: a sandbox is dead when its process is gone, a zombie or
// its pid someone else's; a read that fails for another reason (the server
// out of file descriptors) leaves it alive. Probe P saw healthy sandboxes
// stopped as "died" within a second of the server reaching its limit.
func TestCmdlineAlive(t *testing.T) {
	const id = "sbx_abcdefghijklmnop"
	cmdline := []byte("runsc\x00--root\x00/run/x\x00boot\x00" + id + "\x00")
	for _, c := range []struct {
		what string
		b    []byte
		err  error
		want bool
	}{
		{"its own command line", cmdline, nil, true},
		{"a zombie", nil, nil, false},
		{"a recycled pid", []byte("bash\x00"), nil, false},
		{"gone", nil, &fs.PathError{Op: "open", Path: "/proc/1/cmdline", Err: syscall.ENOENT}, false},
		{"gone while read", nil, &fs.PathError{Op: "read", Path: "/proc/1/cmdline", Err: syscall.ESRCH}, false},
		{"out of descriptors", nil, &fs.PathError{Op: "open", Path: "/proc/1/cmdline", Err: syscall.EMFILE}, true},
		{"the host out of descriptors", nil, &fs.PathError{Op: "open", Path: "/proc/1/cmdline", Err: syscall.ENFILE}, true},
	} {
		if got := cmdlineAlive(c.b, c.err, id); got != c.want {
			t.Errorf("%s: alive = %v, want %v", c.what, got, c.want)
		}
	}
}
