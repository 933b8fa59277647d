package jupyter

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

func guarded(o *Options) {
	o.SetupCode = PythonSetupCode
	o.OutputCapCode = PythonOutputCapCode
	o.DroppedExpr = PythonDroppedExpr
	o.ReseedCode = PythonReseedCode
}

// TestOutputFloodIsCappedInTheKernel: whatever the write size, a cell's
// output is cut at the cap inside the kernel, which survives it, and the
// truncation marker counts every byte left out.
func TestOutputFloodIsCappedInTheKernel(t *testing.T) {
	k := startKernel(t, guarded)
	mustText(t, k, "marker = 7\nmarker", "7")
	for _, size := range []int{64 << 10, 1 << 20} {
		n := (256 << 20) / size
		e, _ := runCode(t, k, fmt.Sprintf("import sys\nfor i in range(%d): sys.stdout.write('a' * %d)", n, size), ExecOptions{})
		want := fmt.Sprintf("[output truncated: %d bytes omitted]", n*size-DefaultOutputCap)
		if e.Error != nil || !strings.HasPrefix(e.Stdout, strings.Repeat("a", DefaultOutputCap)) || !strings.Contains(e.Stdout, want) {
			t.Fatalf("%d writes of %d bytes: error %+v, stdout of %d bytes ending %q; want %q", n, size, e.Error, len(e.Stdout), e.Stdout[max(len(e.Stdout)-60, 0):], want)
		}
		mustText(t, k, "marker", "7")
	}
	// A cell that fails or times out after its flood: the count still
	// comes (ipykernel evaluates user expressions only on success), and
	// subprocess output drained at the end is counted too.
	for _, c := range []struct {
		code    string
		timeout time.Duration
		omitted int
		err     string
	}{
		{"print('x' * 2_000_000)\n1/0", 0, 2_000_001 - DefaultOutputCap, "ZeroDivisionError"},
		{"import sys, time\nsys.stdout.write('y' * 3_000_000)\ntime.sleep(60)", 2 * time.Second, 3_000_000 - DefaultOutputCap, "TimeoutError"},
		{"import subprocess\n_ = subprocess.run(['seq', '1', '300000'])\n1/0", 0, 1_988_895 - DefaultOutputCap, "ZeroDivisionError"},
	} {
		e, _ := runCode(t, k, c.code, ExecOptions{Timeout: c.timeout})
		want := fmt.Sprintf("[output truncated: %d bytes omitted]", c.omitted)
		if e.Error == nil || e.Error.Name != c.err || !strings.Contains(e.Stdout, want) {
			t.Fatalf("%q: error %+v, stdout of %d bytes ending %q; want %q", c.code, e.Error, len(e.Stdout), e.Stdout[max(len(e.Stdout)-60, 0):], want)
		}
	}
	// A smaller cap for one run, then the default again.
	e, _ := runCode(t, k, "print('b' * 100)", ExecOptions{OutputCap: 10})
	if !strings.HasPrefix(e.Stdout, "bbbbbbbbbb\n[output truncated: 91 bytes omitted]") {
		t.Fatalf("cap 10: %q", e.Stdout)
	}
	if e, _ = runCode(t, k, "print('c' * 100)", ExecOptions{}); e.Stdout != strings.Repeat("c", 100)+"\n" {
		t.Fatalf("default cap after a small one: %q", e.Stdout)
	}
}

// TestHugeResultIsBounded: a 200 MB string as the cell's value answers
// with a bounded text and leaves the kernel with its state.
func TestHugeResultIsBounded(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "big = 'x' * 200_000_000\nbig", ExecOptions{})
	if e.Error != nil || len(e.Text) > DefaultOutputCap+200 || !strings.Contains(e.Text, "result truncated") {
		t.Fatalf("200 MB result: error %+v, text of %d bytes", e.Error, len(e.Text))
	}
	mustText(t, k, "len(big)", "200000000")
	mustText(t, k, "'short'", "'short'")
	// A rich form past the results' cap is left out, and its text says so
	// (the object's own text/plain is kept after the note).
	e, _ = runCode(t, k, "class Big:\n    def _repr_png_(self): return b'\\x89PNG' + bytes(40 << 20)\n    def __repr__(self): return '<Big>'\ndisplay(Big())", ExecOptions{})
	if e.Error != nil || len(e.Results) != 1 || !strings.Contains(e.Results[0].Text, "[result too large: its image/png form (40 MiB) was omitted") || !strings.HasSuffix(e.Results[0].Text, "<Big>") || e.Results[0].PNG != "" {
		t.Fatalf("a 40 MiB PNG: error %+v, results %+v", e.Error, e.Results)
	}
}

// TestResetOutFreesResults: %reset -f out lets go of the results it
// drops; IPython alone kept the last ones (its own note of _, __ and ___).
func TestResetOutFreesResults(t *testing.T) {
	k := startKernel(t, guarded)
	mustText(t, k, "import weakref\nclass Big:\n    def __repr__(self): return '<Big>'\nbig = Big()\nref = weakref.ref(big)\nbig", "<Big>")
	mustText(t, k, "del big\nref() is None", "False")
	if e, _ := runCode(t, k, "%reset -f out", ExecOptions{}); e.Error != nil {
		t.Fatal(e.Error)
	}
	mustText(t, k, "import gc; gc.collect(); ref() is None", "True")
	// The cache works as before afterwards.
	mustText(t, k, "6 * 7", "42")
	mustText(t, k, "_", "42")
}

// TestReseed: after Reseed a kernel no longer repeats the sequence it was
// seeded with, as two restores of one image would.
func TestReseed(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "import random, numpy\nrandom.seed(3); numpy.random.seed(3)\nseeded = (random.random(), numpy.random.rand())\nrandom.seed(3); numpy.random.seed(3)", ExecOptions{})
	if e.Error != nil {
		t.Fatal(e.Error)
	}
	mustText(t, k, "import multiprocessing\nkey = multiprocessing.current_process().authkey\nlen(key)", "32")
	k.Reseed()
	mustText(t, k, "(random.random(), numpy.random.rand()) == seeded", "False")
	mustText(t, k, "multiprocessing.current_process().authkey == key", "False")
	mustText(t, k, "random.seed(3); numpy.random.seed(3); (random.random(), numpy.random.rand()) == seeded", "True")
	// ReseedThen: the reseed, then code of its own, in one silent cell.
	// Seeded with 3 again, the code's draw would repeat seeded without the
	// reseed before it.
	mustText(t, k, "random.seed(3); numpy.random.seed(3); 'seeded again'", "'seeded again'")
	if err := k.ReseedThen("after_reseed = (random.random(), numpy.random.rand())"); err != nil {
		t.Fatal(err)
	}
	mustText(t, k, "after_reseed == seeded", "False")
	mustText(t, k, "random.seed(3); numpy.random.seed(3); (random.random(), numpy.random.rand()) == seeded", "True")
}

// TestNoHistory: platform cells leave execution_count alone.
func TestNoHistory(t *testing.T) {
	k := startKernel(t, guarded)
	if e, _ := runCode(t, k, "import math", ExecOptions{NoHistory: true}); e.Error != nil {
		t.Fatal(e.Error)
	}
	if e, _ := runCode(t, k, "math.pi > 3", ExecOptions{}); e.ExecutionCount != 1 || e.Text != "True" {
		t.Fatalf("first counted cell: %+v", e)
	}
}

func TestParseDropped(t *testing.T) {
	for in, want := range map[string][2]int{
		"{'stdout': 0, 'stderr': 12}":      {0, 12},
		"{'stderr': 5, 'stdout': 1234567}": {1234567, 5},
		"garbage":                          {0, 0},
	} {
		if o, e := parseDropped(in); o != want[0] || e != want[1] {
			t.Errorf("parseDropped(%q) = %d, %d, want %v", in, o, e, want)
		}
	}
}

// TestBashEnvCode runs the generated code in a real bash: the variables
// are set for the cell, exported to its children, and put back after.
func TestBashEnvCode(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	set, restore := BashEnvCode(map[string]string{"NEW": "it's $HOME \"q\"\nline", "KEEP": "temp", "LOCAL": "x"})
	script := "KEEP=orig; export KEEP; LOCAL=mine\n" + set +
		"echo \"cell:$NEW|$KEEP|$LOCAL\"; bash -c 'echo child:$LOCAL'\n" + restore +
		"echo \"after:${NEW-unset}|$KEEP|$LOCAL\"; bash -c 'echo child:${LOCAL-unset}:$KEEP'\n"
	out, err := exec.Command(bash, "-c", script).CombinedOutput()
	want := "cell:it's $HOME \"q\"\nline|temp|x\nchild:x\nafter:unset|orig|mine\nchild:unset:orig\n"
	if err != nil || string(out) != want {
		t.Fatalf("bash env code: %v\n%s\nwant\n%s", err, out, want)
	}
}

func TestBashReseedCode(t *testing.T) {
	a, b := BashReseedCode(), BashReseedCode()
	if !strings.HasPrefix(a, "RANDOM=") || a == b {
		t.Fatalf("reseed code %q then %q", a, b)
	}
}

// TestRestartIfDead: a dead kernel is restarted once, however many callers
// found it dead; a live one is left alone.
func TestRestartIfDead(t *testing.T) {
	k := startKernel(t, guarded)
	ctx := context.Background()
	if did, err := k.RestartIfDead(ctx); did || err != nil {
		t.Fatalf("RestartIfDead on a live kernel: %v %v", did, err)
	}
	mustText(t, k, "kept = 1\nkept", "1")
	if e, _ := runCode(t, k, "import os\nos._exit(1)", ExecOptions{}); e.Error == nil || e.Error.Name != "KernelDied" {
		t.Fatalf("os._exit: %+v", e.Error)
	}
	if did, err := k.RestartIfDead(ctx); !did || err != nil {
		t.Fatalf("RestartIfDead on a dead kernel: %v %v", did, err)
	}
	if did, err := k.RestartIfDead(ctx); did || err != nil {
		t.Fatalf("RestartIfDead again: %v %v", did, err)
	}
	if e, _ := runCode(t, k, "kept", ExecOptions{}); e.Error == nil || e.Error.Name != "NameError" {
		t.Fatalf("state after the restart: %+v", e)
	}
}

// TestTrimmedCellKeepsWhatUsersSee: the setup code drops per-cell work the
// agent has no use for (the 0.5 ms sleep, execute_input, empty flushes,
// a history write per cell), and a user still sees In, Out, _, the
// execution count, %history (the session's, a search, the tail), output
// written at a cell's very end, and output of a background thread.
func TestTrimmedCellKeepsWhatUsersSee(t *testing.T) {
	k := startKernel(t, guarded)
	var timing agentproto.RunTiming
	e, _ := runCode(t, k, "1+1", ExecOptions{Timing: &timing})
	if e.Text != "2" || e.Error != nil {
		t.Fatalf("1+1: %+v", e)
	}
	// busy, execute_result, idle and the reply; no execute_input.
	if timing.Messages != 4 || timing.KernelUS <= 0 || timing.ExecuteUS <= 0 || timing.QueueUS < 0 {
		t.Fatalf("timing of 1+1: %+v; want 4 messages and the kernel's times", timing)
	}
	mustText(t, k, "ip = get_ipython(); (ip.kernel._execute_sleep, ip.history_manager.db_cache_size)", "(0.0, 20)")
	mustText(t, k, "alpha = 40\nalpha + 2", "42")
	first, _ := runCode(t, k, "In[-1], _, _ + 1", ExecOptions{})
	if first.Text != "('In[-1], _, _ + 1', 42, 43)" {
		t.Fatalf("In, _: %q", first.Text)
	}
	count := first.ExecutionCount
	e, _ = runCode(t, k, "Out[_ih.index('alpha = 40\\nalpha + 2')]", ExecOptions{})
	if e.Text != "42" || e.ExecutionCount != count+1 {
		t.Fatalf("Out[n]: %q at count %d, want 42 at %d", e.Text, e.ExecutionCount, count+1)
	}
	for _, c := range []struct{ code, want string }{
		{"%history -n 1-3", "alpha = 40"},
		{"%history -g alpha = 40", "alpha = 40"},
		{"%history -l 3", "Out[_ih.index("},
	} {
		e, _ = runCode(t, k, c.code, ExecOptions{})
		if e.Error != nil || !strings.Contains(e.Stdout, c.want) {
			t.Fatalf("%s: stdout %q, error %+v; want %q in it", c.code, e.Stdout, e.Error, c.want)
		}
	}
	// Output that the last statement writes, with and without a newline,
	// to both streams, and from a thread that ends before the cell.
	e, _ = runCode(t, k, "import sys, threading\nprint('a')\nth = threading.Thread(target=lambda: print('from a thread'))\nth.start(); th.join()\nsys.stderr.write('e')\nsys.stdout.write('z')", ExecOptions{})
	if e.Stdout != "a\nfrom a thread\nz" || e.Stderr != "e" {
		t.Fatalf("stdout %q, stderr %q", e.Stdout, e.Stderr)
	}
	// Output pending in ipykernel's 0.2 s buffer when the cell ends.
	for range 5 {
		e, _ = runCode(t, k, "import time\nprint('x', end='')\ntime.sleep(0.19)\nprint('y', end='')", ExecOptions{})
		if e.Stdout != "xy" {
			t.Fatalf("stdout %q, want xy", e.Stdout)
		}
	}
}

// TestDisplaysAsInANotebook: an updated display is one result showing its
// last state; clear_output() drops what the cell showed before it (at once,
// or with wait=True at the next output).
func TestDisplaysAsInANotebook(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "h = display('start', display_id=True)\nfor i in range(300): h.update(str(i))\nprint('done')", ExecOptions{})
	if e.Error != nil || len(e.Results) != 1 || e.Results[0].Text != "'299'" || e.Stdout != "done\n" {
		t.Errorf("an updated display: %+v", e)
	}
	e, _ = runCode(t, k, "from IPython.display import clear_output, display\nprint('a'); display('x')\nclear_output()\nprint('b')", ExecOptions{})
	if e.Error != nil || len(e.Results) != 0 || e.Stdout != "b\n" {
		t.Errorf("clear_output(): %+v", e)
	}
	e, _ = runCode(t, k, "for i in range(3):\n    clear_output(wait=True)\n    print('step', i)\n    display(i)", ExecOptions{})
	if e.Error != nil || len(e.Results) != 1 || e.Results[0].Text != "2" || e.Stdout != "step 2\n" {
		t.Errorf("clear_output(wait=True): %+v", e)
	}
	// A clear starts the cap afresh: ten lines of 300 KiB, each after a
	// clear, leave the last whole (3 MB in all, the cap is 1 MiB).
	e, _ = runCode(t, k, "for i in range(10):\n    clear_output(wait=True)\n    print(str(i) * 300_000)", ExecOptions{})
	if e.Error != nil || e.Stdout != strings.Repeat("9", 300_000)+"\n" {
		t.Errorf("prints after clears: error %+v, %d bytes of stdout ending %q", e.Error, len(e.Stdout), e.Stdout[max(len(e.Stdout)-60, 0):])
	}
}

// TestTruncationCountsBytes: the marker counts bytes, also of text whose
// characters take several (the kernel cuts by characters, the agent by
// bytes).
func TestTruncationCountsBytes(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "print('é' * 3_000_000)", ExecOptions{})
	// 6_000_001 bytes in all, 1 MiB of them kept.
	if want := fmt.Sprintf("[output truncated: %d bytes omitted]", 6_000_001-DefaultOutputCap); e.Error != nil || !strings.Contains(e.Stdout, want) {
		t.Errorf("stdout ends %q, want %q", e.Stdout[max(len(e.Stdout)-60, 0):], want)
	}
}

// TestExceptionGroupTraceback: IPython prints an ExceptionGroup's traceback
// to stderr and sends the error without one; the Execution's error has it.
func TestExceptionGroupTraceback(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, `raise ExceptionGroup("grp", [ValueError("a"), TypeError("b")])`, ExecOptions{})
	if e.Error == nil || e.Error.Name != "ExceptionGroup" || !strings.Contains(e.Error.Traceback, "ValueError: a") || !strings.Contains(e.Error.Traceback, "TypeError: b") {
		t.Errorf("error %+v", e.Error)
	}
	e, _ = runCode(t, k, "1/0", ExecOptions{})
	if e.Error == nil || !strings.Contains(e.Error.Traceback, "ZeroDivisionError") {
		t.Errorf("a plain error's traceback: %+v", e.Error)
	}
}

// TestRecursionTracebackIsShort: a recursion past the limit answers with
// its repeated frames collapsed, not the kernel's hundreds of KB.
func TestRecursionTracebackIsShort(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "def f(n): return f(n + 1)\nf(0)", ExecOptions{})
	if e.Error == nil || e.Error.Name != "RecursionError" || len(e.Error.Traceback) > 16<<10 || !strings.Contains(e.Error.Traceback, "repeated") || !strings.Contains(e.Error.Traceback, "return f(n + 1)") {
		t.Fatalf("error %+v", e.Error)
	}
}

// TestExitEndsTheCellOnly: exit() and quit() answer SystemExit, and the
// kernel goes on with its variables.
func TestExitEndsTheCellOnly(t *testing.T) {
	k := startKernel(t, guarded)
	mustText(t, k, "kept = 7\nkept", "7")
	for _, code := range []string{"exit()", "quit(keep_kernel=True)", "%reset -f\nkept = 7\nexit()"} {
		e, _ := runCode(t, k, code, ExecOptions{})
		if e.Error == nil || e.Error.Name != "SystemExit" {
			t.Fatalf("%s: error %+v", code, e.Error)
		}
		time.Sleep(500 * time.Millisecond) // an exit of the kernel would come by now
		mustText(t, k, "kept", "7")
	}
}

// TestShellCommandsReadNoInput: !cmd and x = !cmd read end of file at
// once; on pexpect's terminal a command that read its input waited for
// the cell's timeout.
func TestShellCommandsReadNoInput(t *testing.T) {
	k := startKernel(t, guarded)
	for _, c := range []struct{ code, stdout, text string }{
		{"!cat; read x; echo done $?", "done 1\n", ""},
		{"lines = !cat; echo end\nlines", "", "['end']"},
		{"%system read x; echo got:$x", "", "['got:']"},
	} {
		e, _ := runCode(t, k, c.code, ExecOptions{Timeout: 20 * time.Second})
		if e.Error != nil || strings.ReplaceAll(e.Stdout, "\r\n", "\n") != c.stdout || e.Text != c.text {
			t.Errorf("%q: stdout %q, text %q, error %+v; want stdout %q, text %q", c.code, e.Stdout, e.Text, e.Error, c.stdout, c.text)
		}
	}
}

// TestLoneSurrogates: what a cell prints or raises with half of an emoji
// in it comes out with U+FFFD in its place (a pair joined), not lost.
func TestLoneSurrogates(t *testing.T) {
	k := startKernel(t, guarded)
	e, _ := runCode(t, k, "print('before')\nprint('cut \\ud83d here')\nprint('pair \\ud83d\\ude00')\nprint('after')", ExecOptions{})
	if e.Error != nil || e.Stdout != "before\ncut \ufffd here\npair \U0001F600\nafter\n" || e.Stderr != "" {
		t.Errorf("prints: stdout %q, stderr %q, error %+v", e.Stdout, e.Stderr, e.Error)
	}
	e, _ = runCode(t, k, "raise ValueError('bad \\ud800')", ExecOptions{})
	if e.Error == nil || e.Error.Name != "ValueError" || e.Error.Value != "bad \ufffd" {
		t.Errorf("raise: error %+v", e.Error)
	}
	mustText(t, k, "'\\udcff' + 'x'", "'\\udcffx'")
}

// TestPagerAndLoadGoToStdout: what IPython hands a frontend aside (a
// pager's text for obj?, the next input for %load) comes as stdout,
// without colour codes; before, those cells answered nothing.
func TestPagerAndLoadGoToStdout(t *testing.T) {
	k := startKernel(t, guarded)
	for _, c := range []struct{ code, want string }{
		{"len?", "Return the number of items in a container."},
		{"%pinfo len", "Return the number of items in a container."},
		{"open('loaded.py', 'w').write('x = 41 + 1\\n')\n%load loaded.py", "x = 41 + 1"},
	} {
		e, _ := runCode(t, k, c.code, ExecOptions{})
		if e.Error != nil || !strings.Contains(e.Stdout, c.want) || strings.Contains(e.Stdout, "\x1b") {
			t.Errorf("%q: stdout %q, error %+v; want %q in it, no escapes", c.code, e.Stdout, e.Error, c.want)
		}
	}
}

// TestAwaitCellTimeoutKeepsTheKernel: a cell waiting in a top-level await
// is interrupted in time and the kernel keeps its variables; ipykernel's
// own SIGINT handler woke the wrong loop, so the interrupt took effect
// only when the await ended, and a timeout restarted the kernel.
func TestAwaitCellTimeoutKeepsTheKernel(t *testing.T) {
	k := startKernel(t, guarded)
	mustText(t, k, "kept = 9\nkept", "9")
	e, _ := runCode(t, k, "import asyncio\nawait asyncio.sleep(60)", ExecOptions{Timeout: 2 * time.Second})
	if e.Error == nil || e.Error.Name != "TimeoutError" || strings.Contains(e.Error.Value, "restarted") {
		t.Fatalf("error %+v, want a TimeoutError without a restart", e.Error)
	}
	mustText(t, k, "kept", "9")
	mustText(t, k, "import asyncio\nawait asyncio.sleep(0.01)\nkept + 1", "10")
}
