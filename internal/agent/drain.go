package agent

import (
	"fmt"
	"os"
	"time"
)

// After a command exits, its output is read on until the readers meet
// EOF. A child that inherited the pipes (or the terminal) may hold them
// open for good, so after drainAfterExit the readers are stopped, but only
// once nothing is left unread: on a loaded host they may lag behind the
// last output, which would otherwise be lost. drainMax bounds that too (a
// child that keeps writing).
//
// A command's own output still in the pipe when it exited is another
// matter: a client reading slowly holds it there, and no bound of time is
// right for it. So an exec goes on draining past drainMax for as long as
// no writer is left on its pipes (exec.go): what they hold then is
// finite, the readers meet its end.
var drainMax = 5 * time.Second

const drainPoll = 10 * time.Millisecond

// keepDraining reports whether output is still to be read from files,
// whose command exited at exited.
func keepDraining(exited time.Time, files ...*os.File) bool {
	return time.Since(exited) < drainMax && unread(files...) > 0
}

// keepDrainingExec says whether an exec whose command exited at exited
// reads on: left bytes wait in its pipes, lastRead is when its readers
// last took output; writerless says whether no process holds the pipes'
// write ends any more. Within drainMax of the exit it reads on while
// bytes wait or output still comes (a pipe a fast writer fills may be
// empty at the moment it is asked); past drainMax, only while the bytes
// that wait are all there will be.
func keepDrainingExec(left int, exited, lastRead time.Time, writerless func() bool) bool {
	if time.Since(exited) < drainMax {
		return left > 0 || time.Since(lastRead) < drainAfterExit
	}
	return left > 0 && writerless()
}

// drained waits, after a command exited at exited, until its readers end
// (closed readers), or until drainAfterExit has passed and keepDraining
// says no more; it reports whether the readers ended. If not, the caller
// closes files, which ends the readers, and waits for them.
func drained(readers <-chan struct{}, exited time.Time, files ...*os.File) bool {
	t := time.NewTimer(drainAfterExit)
	defer t.Stop()
	for {
		select {
		case <-readers:
			return true
		case <-t.C:
		}
		if !keepDraining(exited, files...) {
			return false
		}
		t.Reset(drainPoll)
	}
}

// drainNote tells, last on stderr, that an exec's output stopped being
// read while a process its command started still held it open; dropped
// bytes were left in the pipes.
func drainNote(dropped int) string {
	left := ""
	if dropped > 0 {
		left = fmt.Sprintf(" (%d bytes were left unread)", dropped)
	}
	return fmt.Sprintf("\npandastack: output after this point was not read%s: a process the command started still held it open %s after the command exited\n", left, drainMax)
}
