//go:build linux

package agent

import (
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestReaperLetsStartsInWhileOrphansStream: while orphans die as fast as
// the reaper collects them (a fork bomb's, at its process limit), a
// command still starts. The reaper's pass once held its lock until no
// exited child was left, which such a stream never allows.
func TestReaperLetsStartsInWhileOrphansStream(t *testing.T) {
	var stop atomic.Bool
	var reaped atomic.Int64
	r := &Reaper{log: discardLogger(), waiters: map[int]chan ExitStatus{}}
	r.wait4 = func(int, *syscall.WaitStatus, int, *syscall.Rusage) (int, error) {
		if stop.Load() {
			return 0, nil // children remain, none has exited
		}
		return 1<<22 + int(reaped.Add(1)), nil // an orphan nobody waits for
	}
	passDone := make(chan struct{})
	go func() {
		r.reap()
		close(passDone)
	}()
	defer func() {
		stop.Store(true)
		<-passDone
	}()
	for reaped.Load() == 0 {
		time.Sleep(time.Millisecond)
	}

	type started struct {
		p   *Process
		err error
	}
	ch := make(chan started, 1)
	go func() {
		p, err := r.Start("/bin/true", []string{"true"}, &os.ProcAttr{})
		ch <- started{p, err}
	}()
	select {
	case s := <-ch:
		if s.err != nil {
			t.Fatal(s.err)
		}
		var ws syscall.WaitStatus
		syscall.Wait4(s.p.Pid, &ws, 0, nil) // the fake reaps nothing real
	case <-time.After(10 * time.Second):
		t.Fatalf("a command did not start within 10 s while orphans were reaped (%d so far)", reaped.Load())
	}
	if reaped.Load() < 2 {
		t.Errorf("the reaper's pass stopped while orphans kept dying: %d reaped", reaped.Load())
	}
}
