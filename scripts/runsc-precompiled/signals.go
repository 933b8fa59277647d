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
	"sync"

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

// PrepareSignalForwarding makes the registrations of the next
// StartSignalForwarding now. Each of its signal.Notify calls is a round
// trip to the Go runtime's signal thread: for the some 60 signals a
// forwarding takes, 1-11 ms of a restored sandbox's start on a 2-CPU host,
// which the sentry can spend while it waits for that start instead. A
// signal that arrives before the start is forwarded once it has begun
// (until then it neither reaches the sandbox nor has its default effect
// on the sentry; SIGKILL, which the runtime uses to end a sandbox, is not
// one of them). Later calls, until that start, do nothing.
func PrepareSignalForwarding() {
	pandastackPrepared.mu.Lock()
	prepared := pandastackPrepared.f != nil
	pandastackPrepared.mu.Unlock()
	if prepared {
		return
	}
	f := &pandastackForwarding{start: make(chan struct{})}
	f.stop = StartSignalForwarding(func(sig linux.Signal) {
		<-f.start
		f.handler(sig)
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
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
)

// forwarded returns a handler that passes what it forwards to a channel.
func forwarded() (func(linux.Signal), chan linux.Signal) {
	c := make(chan linux.Signal, 8)
	return func(sig linux.Signal) { c <- sig }, c
}

func expectSignal(t *testing.T, c chan linux.Signal, want linux.Signal) {
	t.Helper()
	select {
	case got := <-c:
		if got != want {
			t.Fatalf("forwarded %v, want %v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%v was not forwarded", want)
	}
}

func raise(t *testing.T, sig unix.Signal) {
	t.Helper()
	if err := unix.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
}

// A prepared forwarding holds a signal that comes before its start and
// forwards it, and the later ones, to the handler its start gives.
func TestPandastackPreparedForwardingDeliversAfterStart(t *testing.T) {
	PrepareSignalForwarding()
	PrepareSignalForwarding() // a second call keeps the first
	raise(t, unix.SIGUSR1)
	time.Sleep(50 * time.Millisecond) // delivered to the forwarding, held
	handler, c := forwarded()
	stop := StartSignalForwarding(handler)
	defer stop()
	expectSignal(t, c, linux.SIGUSR1)
	raise(t, unix.SIGUSR2)
	expectSignal(t, c, linux.SIGUSR2)
	if stop2, ok := pandastackStartPrepared(handler); ok {
		stop2()
		t.Fatal("a prepared forwarding was started twice")
	}
}

// Without a preparation StartSignalForwarding registers its own, as
// gVisor's does.
func TestPandastackStartWithoutPreparation(t *testing.T) {
	handler, c := forwarded()
	stop := StartSignalForwarding(handler)
	defer stop()
	raise(t, unix.SIGUSR2)
	expectSignal(t, c, linux.SIGUSR2)
}
`
