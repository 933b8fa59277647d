package jupyter

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// These tests run real ipykernel processes natively. They need a python3
// with ipykernel, matplotlib and pandas: PANDASTACK_TEST_PYTHON, or the
// python3 on PATH. scripts/test-python-env.sh makes one.

var (
	pythonOnce sync.Once
	pythonPath string
	pythonErr  string
)

const pythonModules = "import ipykernel, matplotlib, pandas"

func requirePython(t *testing.T) string {
	t.Helper()
	pythonOnce.Do(func() {
		if p := os.Getenv("PANDASTACK_TEST_PYTHON"); p != "" {
			if out, err := exec.Command(p, "-c", pythonModules).CombinedOutput(); err != nil {
				pythonErr = fmt.Sprintf("PANDASTACK_TEST_PYTHON=%s cannot %q: %v\n%s", p, pythonModules, err, out)
			} else {
				pythonPath = p
			}
			return
		}
		if p, err := exec.LookPath("python3"); err == nil && exec.Command(p, "-c", pythonModules).Run() == nil {
			pythonPath = p
			return
		}
		pythonErr = "no python3 with ipykernel, matplotlib and pandas"
	})
	if pythonPath != "" {
		return pythonPath
	}
	msg := pythonErr + "; fix: export PANDASTACK_TEST_PYTHON=$(scripts/test-python-env.sh)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

var _ Proc = (*testProc)(nil)

// testProc is a kernel process started by testLaunch.
type testProc struct {
	p      *os.Process
	done   chan struct{}
	reason string
}

func (p *testProc) Pid() int              { return p.p.Pid }
func (p *testProc) Done() <-chan struct{} { return p.done }
func (p *testProc) ExitReason() string    { <-p.done; return p.reason }
func (p *testProc) Kill() {
	// The group cannot be recycled while any member lives; the pid can
	// once reaped, and os.Process knows when that happened.
	syscall.Kill(-p.p.Pid, syscall.SIGKILL)
	p.p.Kill()
}

// testLaunch starts kernels in their own process group, their output going
// to logPath.
func testLaunch(logPath string) Launcher { return testLaunchAs(logPath, nil) }

// testLaunchAs is testLaunch with the kernel running as cred's user.
func testLaunchAs(logPath string, cred *syscall.Credential) Launcher {
	return func(argv, env []string, cwd string) (Proc, error) {
		path, err := exec.LookPath(argv[0])
		if err != nil {
			return nil, err
		}
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer logf.Close()
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		defer devnull.Close()
		p, err := os.StartProcess(path, argv, &os.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []*os.File{devnull, logf, logf},
			Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
		})
		if err != nil {
			return nil, err
		}
		tp := &testProc{p: p, done: make(chan struct{})}
		go func() {
			st, err := p.Wait()
			switch {
			case err != nil:
				tp.reason = err.Error()
			case st.Sys().(syscall.WaitStatus).Signaled():
				tp.reason = "killed by " + signalName(st.Sys().(syscall.WaitStatus).Signal())
			default:
				tp.reason = "exit status " + strconv.Itoa(st.ExitCode())
			}
			close(tp.done)
		}()
		return tp, nil
	}
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	}
	return "signal " + strconv.Itoa(int(s))
}

type testKernel struct {
	*Kernel
	runtimeDir string
}

// startKernel starts an ipykernel for t and closes it at the end.
func startKernel(t *testing.T, tune ...func(*Options)) *testKernel {
	t.Helper()
	py := requirePython(t)
	tmp := t.TempDir()
	runtimeDir := filepath.Join(tmp, "run")
	if err := os.Mkdir(runtimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(tmp, "kernel.log")
	env := slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "MPLBACKEND=")
	})
	o := Options{
		// The agent's launcher, as the agent starts Python kernels.
		Argv:       PythonLauncherArgv([]string{py, "-m", "ipykernel_launcher", "-f", "{connection_file}"}),
		Env:        append(env, "MPLCONFIGDIR="+filepath.Join(tmp, "mpl"), "PYDEVD_DISABLE_FILE_VALIDATION=1"),
		Cwd:        tmp,
		Launch:     testLaunch(logPath),
		Log:        slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RuntimeDir: runtimeDir,
		EnvCode:    PythonEnvCode,
	}
	for _, f := range tune {
		f(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := Start(ctx, o)
	if err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("start kernel: %v\nkernel output:\n%s", err, b)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kernel output:\n%s", b)
		}
	})
	return &testKernel{Kernel: k, runtimeDir: runtimeDir}
}

// testWriter sends logs to t.Log, and nowhere once the test is over.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { recover() }() // a log line after the test ended
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// runCode executes code and collects its events; it fails t on an error
// return.
func runCode(t *testing.T, k *testKernel, code string, o ExecOptions) (agentproto.Execution, []agentproto.CodeEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var evs []agentproto.CodeEvent
	e, err := k.Execute(ctx, code, o, func(ev agentproto.CodeEvent) { evs = append(evs, ev) })
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != "execution" {
		t.Fatalf("execute %q: the last event is not the execution: %+v", code, evs)
	}
	return e, evs
}

func mustText(t *testing.T, k *testKernel, code, want string) {
	t.Helper()
	e, _ := runCode(t, k, code, ExecOptions{})
	if e.Error != nil {
		t.Fatalf("%q: error %+v", code, e.Error)
	}
	if e.Text != want {
		t.Fatalf("%q: text %q, want %q", code, e.Text, want)
	}
}

// The kernel is started once for the tests that leave it usable.
func TestKernel(t *testing.T) {
	k := startKernel(t)

	t.Run("StatePersists", func(t *testing.T) {
		e1, _ := runCode(t, k, "x = 41", ExecOptions{})
		e2, evs := runCode(t, k, "x + 1", ExecOptions{})
		if e2.Text != "42" || e2.Error != nil {
			t.Fatalf("x + 1: %+v", e2)
		}
		if e2.ExecutionCount != e1.ExecutionCount+1 {
			t.Errorf("execution counts %d then %d", e1.ExecutionCount, e2.ExecutionCount)
		}
		if len(e2.Results) != 1 || !e2.Results[0].IsMainResult {
			t.Errorf("results %+v", e2.Results)
		}
		if evs[0].Type != "result" || evs[0].Result.Text != "42" {
			t.Errorf("events %+v", evs)
		}
	})

	t.Run("StdoutStreamsLive", func(t *testing.T) {
		start := time.Now()
		var first time.Duration
		var got []string
		e, err := k.Execute(context.Background(), "import time, sys\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\nprint('oops', file=sys.stderr)", ExecOptions{},
			func(ev agentproto.CodeEvent) {
				if ev.Type == "stdout" {
					if first == 0 {
						first = time.Since(start)
					}
					got = append(got, ev.Data)
				}
			})
		total := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if e.Stdout != "tick 0\ntick 1\ntick 2\ntick 3\ntick 4\n" || strings.Join(got, "") != e.Stdout {
			t.Fatalf("stdout %q, events %q", e.Stdout, got)
		}
		if e.Stderr != "oops\n" {
			t.Errorf("stderr %q", e.Stderr)
		}
		if total < 2*time.Second || first > total/2 {
			t.Errorf("first output after %v of %v: not live", first, total)
		}
		t.Logf("first stdout after %v, run took %v", first, total)
	})

	t.Run("DataFrame", func(t *testing.T) {
		e, _ := runCode(t, k, "import pandas as pd\npd.DataFrame({'city': ['Paris', 'Oslo'], 'pop': [2.1, 0.7]})", ExecOptions{})
		if e.Error != nil {
			t.Fatal(e.Error)
		}
		if !strings.Contains(e.Text, "Paris") || !strings.Contains(e.Text, "pop") {
			t.Errorf("text %q", e.Text)
		}
		if len(e.Results) != 1 || !strings.Contains(e.Results[0].HTML, "<table") || !e.Results[0].IsMainResult {
			t.Errorf("results %+v", e.Results)
		}
	})

	t.Run("MatplotlibPNG", func(t *testing.T) {
		e, evs := runCode(t, k, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()", ExecOptions{})
		if e.Error != nil {
			t.Fatal(e.Error)
		}
		if len(e.Results) != 1 || e.Results[0].IsMainResult || e.Results[0].PNG == "" {
			t.Fatalf("results %+v", e.Results)
		}
		if e.PNG != e.Results[0].PNG || e.Text != "" {
			t.Errorf("execution png/text not from the display_data")
		}
		b, err := base64.StdEncoding.DecodeString(e.PNG)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 1024 || img.Bounds().Dx() < 100 {
			t.Errorf("png of %d bytes, %v", len(b), img.Bounds())
		}
		if evs[0].Type != "result" || evs[0].Result.PNG != e.PNG {
			t.Errorf("no live result event")
		}
	})

	t.Run("RichMime", func(t *testing.T) {
		e, _ := runCode(t, k, "from IPython.display import display, HTML, Markdown, Latex, SVG, JSON\n"+
			"display(Markdown('**hi**'))\ndisplay(Latex(r'$x^2$'))\n"+
			"display({'application/vnd.plotly.v1+json': {'data': []}, 'application/x-custom': 'c', 'text/plain': 'fig'}, raw=True)\n"+
			"display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>'))\n"+
			"7", ExecOptions{})
		if e.Error != nil {
			t.Fatal(e.Error)
		}
		if len(e.Results) != 5 {
			t.Fatalf("results %+v", e.Results)
		}
		r := e.Results
		if r[0].Markdown != "**hi**" || r[1].LaTeX != "$x^2$" || r[3].SVG == "" || !r[4].IsMainResult || e.Text != "7" {
			t.Errorf("results %+v", r)
		}
		if p, ok := r[2].Plotly.(map[string]any); !ok || p["data"] == nil || r[2].Extra["application/x-custom"] != "c" || r[2].Text != "fig" {
			t.Errorf("plotly/extra result %+v", r[2])
		}
	})

	t.Run("Exception", func(t *testing.T) {
		e, evs := runCode(t, k, "def explode():\n    raise ValueError('boom')\nexplode()", ExecOptions{})
		if e.Error == nil || e.Error.Name != "ValueError" || e.Error.Value != "boom" {
			t.Fatalf("error %+v", e.Error)
		}
		tb := e.Error.Traceback
		if !strings.Contains(tb, "explode") || !strings.Contains(tb, "ValueError") || strings.Contains(tb, "\x1b") {
			t.Errorf("traceback %q", tb)
		}
		if evs[0].Type != "error" || evs[0].Error.Name != "ValueError" {
			t.Errorf("events %+v", evs)
		}
	})

	t.Run("SyntaxError", func(t *testing.T) {
		e, _ := runCode(t, k, "1 +* 2", ExecOptions{})
		if e.Error == nil || e.Error.Name != "SyntaxError" || strings.Contains(e.Error.Traceback, "\x1b") {
			t.Fatalf("error %+v", e.Error)
		}
		mustText(t, k, "x", "41")
	})

	t.Run("InputFails", func(t *testing.T) {
		start := time.Now()
		e, _ := runCode(t, k, "input('name? ')", ExecOptions{Timeout: 20 * time.Second})
		if e.Error == nil || e.Error.Name != "StdinNotImplementedError" || time.Since(start) > 10*time.Second {
			t.Fatalf("error %+v after %v", e.Error, time.Since(start))
		}
		mustText(t, k, "1 + 1", "2")
	})

	t.Run("OutputCap", func(t *testing.T) {
		var markers, live int
		e, err := k.Execute(context.Background(), "print('x' * 5_000_000)\nimport sys\nprint('e' * 3000, file=sys.stderr)", ExecOptions{},
			func(ev agentproto.CodeEvent) {
				if ev.Type == "stdout" {
					if strings.Contains(ev.Data, "[output truncated") {
						markers++
					} else {
						live += len(ev.Data)
					}
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		const marker = "\n[output truncated: 3951425 bytes omitted]\n" // 5_000_001 - 1 MiB
		if len(e.Stdout) != DefaultOutputCap+len(marker) || !strings.HasSuffix(e.Stdout, marker) {
			t.Errorf("stdout of %d bytes ending %q", len(e.Stdout), e.Stdout[max(0, len(e.Stdout)-60):])
		}
		if markers != 1 || live != DefaultOutputCap {
			t.Errorf("%d marker events, %d live bytes", markers, live)
		}
		if len(e.Stderr) != 3001 {
			t.Errorf("stderr of %d bytes", len(e.Stderr))
		}

		e, _ = runCode(t, k, "print('é' * 100)", ExecOptions{OutputCap: 51})
		if !strings.HasPrefix(e.Stdout, strings.Repeat("é", 25)+"\n[output truncated: 151 bytes omitted]") {
			t.Errorf("small cap: %q", e.Stdout)
		}
	})

	t.Run("ConcurrentExecuteIsBusy", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := k.Execute(context.Background(), "import time; time.sleep(1.5)", ExecOptions{}, nil)
			done <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for !k.Busy() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := k.Execute(context.Background(), "1", ExecOptions{}, nil); !errors.Is(err, ErrBusy) {
			t.Errorf("second execute: %v, want ErrBusy", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if k.Busy() {
			t.Error("busy after the run")
		}
	})

	t.Run("Timeout", func(t *testing.T) {
		runCode(t, k, "y = 7", ExecOptions{})
		start := time.Now()
		// The timeout leaves the kernel seconds to reach the sleep: with
		// 1.5 s, on a loaded CI host, the interrupt came before the print.
		e, evs := runCode(t, k, "print('before', flush=True)\nimport time\ntime.sleep(30)\nprint('after')", ExecOptions{Timeout: 4500 * time.Millisecond})
		if d := time.Since(start); d > 20*time.Second { // far from the sleep's 30 s
			t.Errorf("took %v", d)
		}
		if e.Error == nil || e.Error.Name != "TimeoutError" || e.Error.Value != "execution exceeded the 4.5 s timeout" {
			t.Fatalf("error %+v", e.Error)
		}
		if !strings.Contains(e.Error.Traceback, "sleep") {
			t.Errorf("traceback %q", e.Error.Traceback)
		}
		if e.Stdout != "before\n" {
			t.Errorf("stdout %q", e.Stdout)
		}
		var errs []string
		for _, ev := range evs {
			if ev.Type == "error" {
				errs = append(errs, ev.Error.Name)
			}
		}
		if !slices.Equal(errs, []string{"TimeoutError"}) {
			t.Errorf("error events %v", errs)
		}
		mustText(t, k, "y", "7")
	})

	t.Run("BusyLoopInterrupted", func(t *testing.T) {
		e, _ := runCode(t, k, "while True: pass", ExecOptions{Timeout: time.Second})
		if e.Error == nil || e.Error.Name != "TimeoutError" || strings.Contains(e.Error.Value, "restarted") {
			t.Fatalf("error %+v", e.Error)
		}
		mustText(t, k, "y", "7")
	})

	t.Run("Cancel", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := k.Execute(ctx, "import time; time.sleep(30)", ExecOptions{}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 15*time.Second { // far from the sleep's 30 s
			t.Fatalf("err %v after %v", err, time.Since(start))
		}
		// The next cell waits for the cancelled one to stop rather than
		// failing busy, and finds the state kept.
		mustText(t, k, "y", "7")
	})

	t.Run("CancelledCellIgnoringInterrupts", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		_, err := k.Execute(ctx, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", ExecOptions{}, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v", err)
		}
		// The next cell waits for it, which takes a restart: that cell is
		// not run, and says so, rather than running in an empty kernel.
		if _, err := k.Execute(context.Background(), "y", ExecOptions{}, nil); !errors.Is(err, ErrRestarted) {
			t.Fatalf("the cell after: %v, want ErrRestarted", err)
		}
		mustText(t, k, "'y' in globals()", "False")
		runCode(t, k, "y = 7", ExecOptions{})
	})

	t.Run("EnvPerRun", func(t *testing.T) {
		e, _ := runCode(t, k, "import os\nos.environ.get('PDS_GREETING')", ExecOptions{Env: map[string]string{"PDS_GREETING": "hi 'there'\n\"€\""}})
		if e.Text != `'hi \'there\'\n"€"'` {
			t.Errorf("with env: %q", e.Text)
		}
		mustText(t, k, "os.environ.get('PDS_GREETING')", "")
		mustText(t, k, "'_pandastack_env' in globals()", "False")
		if _, err := k.Execute(context.Background(), "1", ExecOptions{Env: map[string]string{"A=B": "c"}}, nil); err == nil {
			t.Error("bad env name accepted")
		}
	})

	t.Run("RoundTrip", func(t *testing.T) {
		var ds []time.Duration
		for range 50 {
			start := time.Now()
			e, err := k.Execute(context.Background(), "1+1", ExecOptions{}, nil)
			ds = append(ds, time.Since(start))
			if err != nil || e.Text != "2" {
				t.Fatalf("1+1: %+v, %v", e, err)
			}
		}
		slices.Sort(ds)
		t.Logf("1+1 round trip: median %v, min %v, max %v", ds[len(ds)/2], ds[0], ds[len(ds)-1])
		if ds[len(ds)/2] > 500*time.Millisecond {
			t.Errorf("median round trip %v", ds[len(ds)/2])
		}
	})
}

func TestKernelDiesAndRestarts(t *testing.T) {
	k := startKernel(t)
	runCode(t, k, "z = 1", ExecOptions{})
	for _, c := range []struct{ code, reason string }{
		{"import os\nprint('going', flush=True)\nimport time; time.sleep(0.3)\nos._exit(1)", "the kernel process exited (exit status 1)"},
		{"import ctypes\nctypes.string_at(0)", "the kernel process exited (killed by SIGSEGV)"},
	} {
		e, evs := runCode(t, k, c.code, ExecOptions{})
		if e.Error == nil || e.Error.Name != "KernelDied" || e.Error.Value != c.reason {
			t.Fatalf("error %+v", e.Error)
		}
		if strings.Contains(c.code, "going") && e.Stdout != "going\n" {
			t.Errorf("stdout %q", e.Stdout)
		}
		if evs[len(evs)-2].Type != "error" {
			t.Errorf("events %+v", evs)
		}
		_, err := k.Execute(context.Background(), "1", ExecOptions{}, nil)
		if !errors.Is(err, ErrDead) || !strings.Contains(err.Error(), "restart") {
			t.Fatalf("execute on a dead kernel: %v", err)
		}
		if err := k.Interrupt(); !errors.Is(err, ErrDead) {
			t.Errorf("interrupt on a dead kernel: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := k.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		mustText(t, k, "1 + 1", "2")
		e, _ = runCode(t, k, "z", ExecOptions{})
		if e.Error == nil || e.Error.Name != "NameError" {
			t.Errorf("state after restart: %+v", e)
		}
	}
}

// TestLastWordsBeforeDeath: what a cell printed right before its kernel
// died comes back with the KernelDied error, even when the agent learns of
// the death before it has read the kernel's last messages. (With a real
// kernel that race cannot be held still: a kernel killed right after a
// flush may also lose the message itself, in libzmq's queue.)
func TestLastWordsBeforeDeath(t *testing.T) {
	dead := make(chan struct{})
	close(dead)
	in := &instance{proc: deadProc{dead}, iopubDropped: make(chan struct{})}
	r := newRun(DefaultOutputCap)
	go func() {
		time.Sleep(100 * time.Millisecond) // the reader is behind the reaper
		r.handle("iopub", &message{Header: header{MsgType: "stream"}, Content: json.RawMessage(`{"name":"stdout","text":"last words\n"}`)})
		close(in.iopubDropped)
	}()
	var got []agentproto.CodeEvent
	if out := r.wait(context.Background(), in, nil, func(ev agentproto.CodeEvent) { got = append(got, ev) }); out != died {
		t.Fatalf("outcome %v, want died", out)
	}
	if e := r.execution(time.Now()); e.Stdout != "last words\n" || len(got) != 1 || got[0].Type != "stdout" {
		t.Fatalf("stdout %q, events %+v", e.Stdout, got)
	}
}

// TestLateResultCounts: with Options.LateOutput, a result that comes
// after the cell's reply and idle status (Deno's kernel sends it from
// another task) is the run's, and the run ends as it comes; without, the
// run ends at the idle status. Nothing counts once the run is sealed.
func TestLateResultCounts(t *testing.T) {
	live := &instance{proc: deadProc{make(chan struct{})}, iopubDropped: make(chan struct{})}
	result := &message{Header: header{MsgType: "execute_result"}, Content: json.RawMessage(`{"data":{"text/plain":"5"}}`)}
	for _, late := range []time.Duration{0, 10 * time.Second} {
		r := newRun(DefaultOutputCap)
		r.lateFor = late
		r.handle("shell", &message{Header: header{MsgType: "execute_reply"}, Content: json.RawMessage(`{"status":"ok"}`)})
		r.handle("iopub", &message{Header: header{MsgType: "status"}, Content: json.RawMessage(`{"execution_state":"idle"}`)})
		go func() {
			time.Sleep(50 * time.Millisecond)
			r.handle("iopub", result)
		}()
		t0 := time.Now()
		if out := r.wait(context.Background(), live, nil, func(agentproto.CodeEvent) {}); out != finished {
			t.Fatalf("late %s: outcome %v, want finished", late, out)
		}
		took := time.Since(t0)
		e := r.finish(time.Now(), nil, func(agentproto.CodeEvent) {})
		switch {
		case late == 0 && e.Text != "":
			t.Errorf("without LateOutput: text %q, want none (the run ended at the idle status)", e.Text)
		case late > 0 && (e.Text != "5" || took > 5*time.Second):
			t.Errorf("with LateOutput: text %q after %s, want the late result as it came", e.Text, took)
		}
		r.handle("iopub", result) // sealed: changes nothing
		if n := len(r.exec.Results); n > 1 {
			t.Errorf("late %s: %d results after the run was sealed", late, n)
		}
	}
}

// deadProc is a kernel process that has exited.
type deadProc struct{ done chan struct{} }

func (p deadProc) Pid() int              { return 0 }
func (p deadProc) Done() <-chan struct{} { return p.done }
func (p deadProc) ExitReason() string    { return "exit status 1" }
func (p deadProc) Kill()                 {}

// orderProc is a live kernel process that notes the kills it gets; Kill
// ends it.
type orderProc struct {
	calls []string
	done  chan struct{}
}

func (p *orderProc) Pid() int              { return 4242 }
func (p *orderProc) Done() <-chan struct{} { return p.done }
func (p *orderProc) ExitReason() string    { return "killed by SIGKILL" }
func (p *orderProc) Kill() {
	p.calls = append(p.calls, "tree")
	select {
	case <-p.done:
	default:
		close(p.done)
	}
}

type groupProc struct{ *orderProc }

func (p groupProc) KillGroup() { p.calls = append(p.calls, "group") }

// TestKillGroupThenKill: KillGroup has a GroupKiller's group killed, and
// the Kill after it the tree; a Proc that is none gets the tree kill
// alone; a closed kernel gets nothing more.
func TestKillGroupThenKill(t *testing.T) {
	for _, tc := range []struct {
		name string
		mk   func(*orderProc) Proc
		want []string
	}{
		{"group killer", func(p *orderProc) Proc { return groupProc{p} }, []string{"group", "tree"}},
		{"plain proc", func(p *orderProc) Proc { return p }, []string{"tree"}},
	} {
		p := &orderProc{done: make(chan struct{})}
		k := &Kernel{inst: &instance{proc: tc.mk(p), close: func() {}}}
		k.KillGroup()
		if err := k.Kill(); err != nil {
			t.Fatalf("%s: Kill: %v", tc.name, err)
		}
		if !slices.Equal(p.calls, tc.want) {
			t.Fatalf("%s: kills %v, want %v", tc.name, p.calls, tc.want)
		}
		k.KillGroup()
		if err := k.Kill(); err != nil || len(p.calls) != len(tc.want) {
			t.Fatalf("%s: a second KillGroup and Kill: %v, kills %v", tc.name, err, p.calls)
		}
	}
}

func TestKilledFromOutside(t *testing.T) {
	k := startKernel(t)
	if k.Exited() {
		t.Fatal("a kernel just started says it exited")
	}
	pid := k.Pid()
	time.AfterFunc(500*time.Millisecond, func() { syscall.Kill(pid, syscall.SIGKILL) })
	e, _ := runCode(t, k, "import time; time.sleep(30)", ExecOptions{})
	if e.Error == nil || e.Error.Name != "KernelDied" || e.Error.Value != "the kernel process exited (killed by SIGKILL)" {
		t.Fatalf("error %+v", e.Error)
	}
	if !k.Exited() {
		t.Fatal("a kernel killed from outside does not say it exited")
	}
}

func TestTimeoutIgnoringInterruptRestarts(t *testing.T) {
	k := startKernel(t, func(o *Options) { o.InterruptGrace = time.Second })
	runCode(t, k, "w = 3", ExecOptions{})
	oldPid := k.Pid()
	start := time.Now()
	// Seconds for the kernel to reach the try, as in TestKernel/Timeout.
	e, _ := runCode(t, k, "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        print('ignored', flush=True)", ExecOptions{Timeout: 4 * time.Second})
	if e.Error == nil || e.Error.Name != "TimeoutError" || !strings.Contains(e.Error.Value, "restarted") {
		t.Fatalf("error %+v", e.Error)
	}
	if !strings.HasPrefix(e.Error.Value, "execution exceeded the 4 s timeout") || e.Stdout != "ignored\n" {
		t.Errorf("execution %+v", e)
	}
	t.Logf("timeout with restart took %v", time.Since(start))
	if k.Pid() == oldPid || pidExists(oldPid) {
		t.Errorf("old kernel pid %d still there (now %d)", oldPid, k.Pid())
	}
	e, _ = runCode(t, k, "w", ExecOptions{})
	if e.Error == nil || e.Error.Name != "NameError" {
		t.Errorf("state after restart: %+v", e)
	}
}

// TestInterruptBeforeTheCellBegins: a timeout that fires before the kernel
// began the cell (it waited behind another request, or the timeout was
// shorter than the way to the kernel) still stops the cell once it begins,
// and the kernel keeps its state rather than being restarted.
func TestInterruptBeforeTheCellBegins(t *testing.T) {
	k := startKernel(t, func(o *Options) { o.InterruptGrace = 3 * time.Second })
	runCode(t, k, "v = 11", ExecOptions{})
	for _, tc := range []struct {
		name    string
		ahead   string // silent code queued ahead of the cell
		timeout time.Duration
	}{
		{"behind another request", "import time; time.sleep(0.5)", 100 * time.Millisecond},
		{"a timeout of 1 ms", "", time.Millisecond},
	} {
		if tc.ahead != "" {
			in, err := k.current()
			if err != nil {
				t.Fatal(err)
			}
			in.sendSilent(tc.ahead)
		}
		e, _ := runCode(t, k, "import time\ntime.sleep(30)", ExecOptions{Timeout: tc.timeout})
		if e.Error == nil || e.Error.Name != "TimeoutError" || strings.Contains(e.Error.Value, "restarted") {
			t.Fatalf("%s: error %+v", tc.name, e.Error)
		}
		mustText(t, k, "v", "11")
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	k := startKernel(t)
	runCode(t, k, "import subprocess; p = subprocess.Popen(['sleep', '300'])", ExecOptions{})
	child, _ := runCode(t, k, "p.pid", ExecOptions{})
	childPid, _ := strconv.Atoi(child.Text)
	pid := k.Pid()
	if ents, _ := os.ReadDir(k.runtimeDir); len(ents) != 1 {
		t.Fatalf("runtime dir holds %d entries while running", len(ents))
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if pidExists(pid) {
		t.Errorf("kernel %d outlived Close", pid)
	}
	// The child is reparented to init when the kernel dies; give init a
	// moment to reap it.
	deadline := time.Now().Add(5 * time.Second)
	for pidExists(childPid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(childPid) + "/stat"); err == nil {
		t.Errorf("the kernel's child outlived Close: %s", b)
	}
	if ents, _ := os.ReadDir(k.runtimeDir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
	if _, err := k.Execute(context.Background(), "1", ExecOptions{}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("execute after close: %v", err)
	}
	if err := k.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// Kill ends a kernel busy in a cell at once, without waiting out the
// shutdown grace, and leaves nothing behind.
func TestKillABusyKernel(t *testing.T) {
	k := startKernel(t)
	pid := k.Pid()
	busy := make(chan agentproto.Execution, 1)
	go func() {
		e, _ := k.Execute(context.Background(), "import time\nwhile True: time.sleep(0.01)", ExecOptions{}, nil)
		busy <- e
	}()
	for !k.Busy() {
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took >= k.opts.ShutdownGrace {
		t.Errorf("Kill took %v, as long as the shutdown grace (%v)", took, k.opts.ShutdownGrace)
	}
	if pidExists(pid) {
		t.Errorf("kernel %d outlived Kill", pid)
	}
	if e := <-busy; e.Error == nil || e.Error.Name != "KernelDied" {
		t.Errorf("the cell running during Kill ended with %+v, want a KernelDied error", e.Error)
	}
	if ents, _ := os.ReadDir(k.runtimeDir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
	if _, err := k.Execute(context.Background(), "1", ExecOptions{}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("execute after kill: %v", err)
	}
}

// The agent runs as root and its kernels as the sandbox user.
func TestKernelAsAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a kernel as another user")
	}
	const nobody = 65534
	probe := exec.Command(requirePython(t), "-c", "import ipykernel")
	probe.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	probe.Dir = "/"
	if out, err := probe.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("the test python is not usable by uid %d (%v: %s); make the venv from a python outside /root, e.g. PYTHON=/usr/bin/python3 scripts/test-python-env.sh", nobody, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg) // a prerequisite missing fails CI rather than skipping
		}
		t.Skip(msg)
	}
	k := startKernel(t, func(o *Options) {
		// The tests' temp dirs are private to root: let nobody through to
		// the runtime dir, and give it a home of its own.
		for d := filepath.Dir(o.RuntimeDir); d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(o.RuntimeDir, 0o711); err != nil {
			t.Fatal(err)
		}
		home := filepath.Join(o.Cwd, "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(home, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		o.Cwd = home
		o.Env = append(o.Env, "HOME="+home, "MPLCONFIGDIR="+home, "IPYTHONDIR="+home)
		o.Owner = &Owner{UID: nobody, GID: nobody}
		o.Launch = testLaunchAs(filepath.Join(filepath.Dir(o.RuntimeDir), "kernel.log"), &syscall.Credential{Uid: nobody, Gid: nobody})
	})
	mustText(t, k, "import os; os.getuid()", strconv.Itoa(nobody))
}

func TestTCPTransport(t *testing.T) {
	k := startKernel(t, func(o *Options) { o.Transport = TCP })
	mustText(t, k, "6 * 7", "42")
}

func TestStartFailure(t *testing.T) {
	py := requirePython(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := Start(ctx, Options{
		Argv:       []string{py, "-c", "import sys; sys.exit(3)", "{connection_file}"},
		Launch:     testLaunch(filepath.Join(t.TempDir(), "log")),
		RuntimeDir: dir,
	})
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("start: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}

	// A kernel that never answers: ctx bounds the start.
	startGivenUp(t, []string{"sleep", "60"}, time.Second)
}

// startGivenUp starts a kernel with argv that never gets ready, within
// limit: the start must end with ctx's deadline, leaving no process and no
// file behind.
func startGivenUp(t *testing.T, argv []string, limit time.Duration) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var proc Proc
	launch := testLaunch(filepath.Join(t.TempDir(), "log"))
	_, err := Start(ctx, Options{
		Argv: argv,
		Launch: func(argv, env []string, cwd string) (Proc, error) {
			p, err := launch(argv, env, cwd)
			proc = p
			return p, err
		},
		RuntimeDir: dir,
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start of a kernel that never gets ready: %v, want the deadline", err)
	}
	if pidExists(proc.Pid()) {
		t.Error("the process outlived the failed start")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// A kernel that binds its sockets but never answers kernel_info: ctx ends
// the start during the handshake, which fails cleanly (it once dereferenced
// the instance it had already given up).
func TestStartGivenUpDuringHandshake(t *testing.T) {
	py := requirePython(t)
	mute := filepath.Join(t.TempDir(), "mute.py")
	os.WriteFile(mute, []byte(`import json, sys, time, zmq
ci = json.load(open(sys.argv[1]))
ctx = zmq.Context()
kinds = {"shell_port": zmq.ROUTER, "control_port": zmq.ROUTER, "stdin_port": zmq.ROUTER, "iopub_port": zmq.PUB, "hb_port": zmq.REP}
socks = []
for name, kind in kinds.items():
    s = ctx.socket(kind)
    if ci["transport"] == "ipc":
        s.bind("ipc://%s-%s" % (ci["ip"], ci[name]))
    else:
        s.bind("tcp://%s:%s" % (ci["ip"], ci[name]))
    socks.append(s)
time.sleep(60)
`), 0o644)
	startGivenUp(t, []string{py, mute, "{connection_file}"}, 2*time.Second)
}

func pidExists(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// TestInterruptByMessage times a cell out with an interrupt_request on the
// control channel instead of SIGINT; the kernel and its state survive.
func TestInterruptByMessage(t *testing.T) {
	k := startKernel(t, func(o *Options) { o.InterruptByMessage = true })
	runCode(t, k, "w = 4", ExecOptions{})
	pid := k.Pid()
	e, _ := runCode(t, k, "import time\ntime.sleep(60)", ExecOptions{Timeout: time.Second})
	if e.Error == nil || e.Error.Name != "TimeoutError" || strings.Contains(e.Error.Value, "restarted") {
		t.Fatalf("error %+v", e.Error)
	}
	if e, _ = runCode(t, k, "w", ExecOptions{}); e.Text != "4" || k.Pid() != pid {
		t.Fatalf("after the interrupt: %+v, pid %d then %d", e, pid, k.Pid())
	}
}

// TestTimeoutWhileConsumerStalls: a caller stuck taking the cell's events
// (a client that stopped reading its stream) does not hold up the cell's
// timeout: the cell is interrupted on time, and the events, the error
// last, arrive in order once the caller takes them again.
func TestTimeoutWhileConsumerStalls(t *testing.T) {
	k := startKernel(t)
	// A first cell: a new kernel's first one does IPython's one-time set-up,
	// which on a loaded host can outlast the timeout before the try.
	runCode(t, k, "1", ExecOptions{})
	mark := filepath.Join(t.TempDir(), "interrupted")
	code := "import time\nprint('first', flush=True)\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    open(" + strconv.Quote(mark) + ", 'w').close()\n    raise"
	stall := make(chan struct{})
	var evs []agentproto.CodeEvent
	type answer struct {
		e   agentproto.Execution
		err error
	}
	got := make(chan answer, 1)
	go func() {
		e, err := k.Execute(t.Context(), code, ExecOptions{Timeout: 4500 * time.Millisecond}, func(ev agentproto.CodeEvent) {
			if len(evs) == 0 {
				<-stall // the first event: the caller stops taking them
			}
			evs = append(evs, ev)
		})
		got <- answer{e, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(mark); err == nil {
			break
		}
		if time.Now().After(deadline) {
			close(stall)
			t.Fatal("the cell was not interrupted while its caller was stuck on its first event")
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stall)
	a := <-got
	if a.err != nil || a.e.Error == nil || a.e.Error.Name != "TimeoutError" || a.e.Stdout != "first\n" {
		t.Fatalf("execution %+v, err %v", a.e, a.err)
	}
	if len(evs) < 2 || evs[0].Type != "stdout" || evs[0].Data != "first\n" || evs[len(evs)-1].Type != "execution" {
		t.Fatalf("events %+v", evs)
	}
}
