package agent

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
)

// A start that failed for want of what the sandbox's own processes took
// is a conflict saying so; anything else is not exhausted's.
func TestExhausted(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&os.SyscallError{Syscall: "fork/exec", Err: syscall.EAGAIN}, "as many processes as it may"},
		{syscall.EMFILE, "file descriptors"},
		{syscall.ENFILE, "file descriptors"},
		{syscall.ENOMEM, "out of memory"},
	} {
		err := exhausted("run \"bash\"", c.err)
		if !pandastack.IsCode(err, pandastack.EConflict) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `cannot run "bash"`) {
			t.Errorf("%v: %v, want a conflict with %q", c.err, err, c.want)
		}
	}
	if err := exhausted("x", syscall.ENOENT); err != nil {
		t.Errorf("ENOENT: %v, want nil", err)
	}
}
