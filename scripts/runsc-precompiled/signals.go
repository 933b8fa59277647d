package main

// The sentry's forwarding of the host's signals to the sandbox, and the
// edits that register it while the sandbox waits for its start rather
// than after (see the package doc and signalsSource).
const signalFile = "pkg/sighandling/sighandling.go"

var signalEdits = []edit{
	{
		"func StartSignalForwarding(handler func(linux.Signal)) func() {\n\tstop := make(chan struct{})\n",
		"func StartSignalForwarding(handler func(linux.Signal)) func() {\n" +
			"\t// PandaStack (scripts/runsc-precompiled): registered already\n" +
			"\t// (pandastack_prepare.go).\n" +
			"\tif stop, ok := pandastackStartPrepared(handler); ok {\n\t\treturn stop\n\t}\n" +
			"\tstop := make(chan struct{})\n",
	},
}

// The loader's wait for the start, where the sentry prepares the
// forwarding (see the package doc).
const loaderFile = "runsc/boot/loader.go"

var loaderEdits = []edit{
	{
		"func (l *Loader) WaitForStartSignal() {\n\t<-l.ctrl.manager.startChan\n}\n",
		"func (l *Loader) WaitForStartSignal() {\n" +
			"\t// PandaStack (scripts/runsc-precompiled): the forwarding's\n" +
			"\t// registrations now, not in the start's path.\n" +
			"\tsighandling.PrepareSignalForwarding()\n" +
			"\t<-l.ctrl.manager.startChan\n}\n",
	},
}

// signalsFile is the file -patch adds to package sighandling,
// signalsSource its content; signalsTestFile and signalsTestSource its
// tests, which scripts/setup.sh runs before it builds runsc.
const (
	signalsFile     = "pkg/sighandling/pandastack_prepare.go"
	signalsTestFile = "pkg/sighandling/pandastack_prepare_test.go"
)

const signalsSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package sighandling

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
)

// A forwarding registered ahead of its start (PrepareSignalForwarding).
type pandastackForwarding struct {
	start   chan struct{} // closed when StartSignalForwarding gives it its handler
	handler func(linux.Signal)
	stop    func()
}

var pandastackPrepared struct {
	mu sync.Mutex
	f  *pandastackForwarding
}

// pandastackEndingSignals are the signals that end a Go program that does
// not ask for them (os/signal's package doc); the others it ignores.
var pandastackEndingSignals = map[linux.Signal]bool{
	linux.SIGHUP: true, linux.SIGINT: true, linux.SIGTERM: true, linux.SIGQUIT: true,
	linux.SIGILL: true, linux.SIGTRAP: true, linux.SIGABRT: true, linux.SIGSTKFLT: true,
	linux.SIGSYS: true,
}

// PrepareSignalForwarding makes the registrations of the next
// StartSignalForwarding now: 30 signal.Notify calls, 18 of them a round
// trip to the Go runtime's signal thread, 1-11 ms of a restored sandbox's
// start on a 2-CPU host, which the sentry can spend while it waits for that
// start instead. Until the start a signal has the effect it had before the
// forwarding was registered: one that ends a Go program still ends the
// sentry, the others are dropped (none reaches the sandbox). Later calls,
// until that start, do nothing.
func PrepareSignalForwarding() {
	pandastackPrepared.mu.Lock()
	prepared := pandastackPrepared.f != nil
	pandastackPrepared.mu.Unlock()
	if prepared {
		return
	}
	f := &pandastackForwarding{start: make(chan struct{})}
	f.stop = StartSignalForwarding(func(sig linux.Signal) {
		select {
		case <-f.start:
			f.handler(sig)
		default:
			if pandastackEndingSignals[sig] {
				signal.Reset(unix.Signal(sig))
				unix.Kill(os.Getpid(), unix.Signal(sig))
			}
		}
	})
	pandastackPrepared.mu.Lock()
	pandastackPrepared.f = f
	pandastackPrepared.mu.Unlock()
}

// pandastackStartPrepared starts the forwarding PrepareSignalForwarding
// registered, with handler, and returns its stop; ok is false when there
// is none (StartSignalForwarding then registers its own).
func pandastackStartPrepared(handler func(linux.Signal)) (stop func(), ok bool) {
	pandastackPrepared.mu.Lock()
	f := pandastackPrepared.f
	pandastackPrepared.f = nil
	pandastackPrepared.mu.Unlock()
	if f == nil {
		return nil, false
	}
	f.handler = handler
	close(f.start)
	return f.stop, true
}
`

const signalsTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package sighandling

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
)

// forwarded returns a handler that passes what it forwards to a channel.
func forwarded() (func(linux.Signal), chan linux.Signal) {
	c := make(chan linux.Signal, 64)
	return func(sig linux.Signal) { c <- sig }, c
}

// expectSignal waits for want among the forwarded signals (a terminal's
// SIGWINCH may come too), failing on never.
func expectSignal(t *testing.T, c chan linux.Signal, want, never linux.Signal) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-c:
			if got == never {
				t.Fatalf("%v was forwarded", never)
			}
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("%v was not forwarded", want)
		}
	}
}

func raise(t *testing.T, sig unix.Signal) {
	t.Helper()
	if err := unix.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
}

// dropPrepared starts and stops a prepared forwarding an earlier test left.
func dropPrepared() {
	if stop, ok := pandastackStartPrepared(func(linux.Signal) {}); ok {
		stop()
	}
}

// A prepared forwarding forwards what comes after its start to the handler
// its start gives, and drops what came before that Go ignores.
func TestPandastackPreparedForwardingStartsWithItsHandler(t *testing.T) {
	dropPrepared()
	PrepareSignalForwarding()
	first := pandastackPrepared.f
	PrepareSignalForwarding()
	if pandastackPrepared.f != first {
		t.Fatal("a second preparation replaced the first")
	}
	raise(t, unix.SIGUSR1)
	time.Sleep(50 * time.Millisecond) // received by the forwarding, before its start
	handler, c := forwarded()
	stop := StartSignalForwarding(handler)
	defer stop()
	raise(t, unix.SIGUSR2)
	expectSignal(t, c, linux.SIGUSR2, linux.SIGUSR1)
	if stop2, ok := pandastackStartPrepared(handler); ok {
		stop2()
		t.Fatal("a prepared forwarding was started twice")
	}
}

// A signal that ends a Go program, sent before the start, still ends the
// process (run in a child process of the test).
func TestPandastackEndingSignalBeforeStart(t *testing.T) {
	if os.Getenv("PANDASTACK_SIGNAL_CHILD") == "1" {
		PrepareSignalForwarding()
		unix.Kill(os.Getpid(), unix.SIGTERM)
		time.Sleep(10 * time.Second)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPandastackEndingSignalBeforeStart$")
	cmd.Env = append(os.Environ(), "PANDASTACK_SIGNAL_CHILD=1")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the child was not ended by SIGTERM: %v", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("the child ended with %v, not by SIGTERM", ws)
	}
}

// Without a preparation StartSignalForwarding registers its own, as
// gVisor's does.
func TestPandastackStartWithoutPreparation(t *testing.T) {
	dropPrepared()
	handler, c := forwarded()
	stop := StartSignalForwarding(handler)
	defer stop()
	raise(t, unix.SIGUSR2)
	expectSignal(t, c, linux.SIGUSR2, 0)
}
`
