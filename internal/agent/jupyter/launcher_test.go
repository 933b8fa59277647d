package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

func TestPythonLauncherArgv(t *testing.T) {
	spec := []string{"/usr/bin/python3", "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"}
	got := PythonLauncherArgv(spec)
	want := []string{"/usr/bin/python3", "-Xfrozen_modules=off", "-c", PythonLauncher, "-f", "{connection_file}"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q", got)
	}
	if spec[2] != "-m" {
		t.Errorf("the kernelspec's argv was changed: %q", spec)
	}
	for _, other := range [][]string{
		{"python3", "-m", "ipykernel", "-f", "{connection_file}"},
		{"/opt/conda/bin/python", "-m", "some_other_kernel", "-f", "{connection_file}"},
		{"python3", "-m"},
	} {
		if got := PythonLauncherArgv(other); !slices.Equal(got, other) {
			t.Errorf("%q became %q", other, got)
		}
	}
}

// request sends req on the shell channel (or control) and returns its
// reply's content.
func request(t *testing.T, k *testKernel, control bool, req string, content any) map[string]any {
	t.Helper()
	in, err := k.current()
	if err != nil {
		t.Fatal(err)
	}
	sock, channel := in.shell, "shell"
	if control {
		sock, channel = in.control, "control"
	}
	reply := make(chan json.RawMessage, 1)
	id, err := in.send(sock, req, content, func(ch string, m *message) {
		if ch == channel && strings.HasSuffix(m.Header.MsgType, "_reply") {
			select {
			case reply <- m.Content:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer in.forget(id)
	select {
	case c := <-reply:
		var v map[string]any
		if err := json.Unmarshal(c, &v); err != nil {
			t.Fatal(err)
		}
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("no reply to %s", req)
		return nil
	}
}

// TestPythonLauncher checks what PythonLauncher changes (startKernel uses
// it, so the other tests of this package check what it must not change).
func TestPythonLauncher(t *testing.T) {
	k := startKernel(t)

	t.Run("NoShellChannelThread", func(t *testing.T) {
		mustText(t, k, "import threading\nsorted(t.name for t in threading.enumerate() if t.name in ('Shell channel', 'IOPub', 'Control'))", "['Control', 'IOPub']")
	})

	t.Run("NoSubshells", func(t *testing.T) {
		info := request(t, k, false, "kernel_info_request", struct{}{})
		if info["status"] != "ok" || info["protocol_version"] == nil {
			t.Fatalf("kernel_info_reply %v", info)
		}
		if features, _ := info["supported_features"].([]any); slices.Contains(features, any("kernel subshells")) {
			t.Errorf("supported_features %v", features)
		}
		// Subshells are asked for on the control channel. ipykernel
		// leaves the request of a kernel without them unanswered (and logs
		// an error); the kernel carries on.
		in, err := k.current()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := in.send(in.control, "create_subshell_request", struct{}{}, nil); err != nil {
			t.Fatal(err)
		}
		mustText(t, k, "'still fine'", "'still fine'")
	})

	t.Run("AsyncCell", func(t *testing.T) {
		mustText(t, k, "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'", "'awaited'")
	})

	// Output of a thread of the cell, and of a subprocess, reaches the
	// caller while the main thread is still busy: the cell waits for the
	// caller to have seen it (a file the test writes on the output).
	for _, c := range []struct{ name, start string }{
		{"ThreadOutputLive", "threading.Thread(target=lambda: print('ping', flush=True)).start()"},
		{"SubprocessOutputLive", "subprocess.Popen(['sh', '-c', 'echo ping'])"},
	} {
		t.Run(c.name, func(t *testing.T) {
			seen := filepath.Join(t.TempDir(), "seen")
			code := "import os, subprocess, threading, time\n" + c.start + "\n" +
				"for _ in range(3000):\n" +
				"    if os.path.exists(" + pyString(seen) + "):\n" +
				"        break\n" +
				"    time.sleep(0.01)\n" +
				"os.path.exists(" + pyString(seen) + ")"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			e, err := k.Execute(ctx, code, ExecOptions{}, func(ev agentproto.CodeEvent) {
				if ev.Type == "stdout" && strings.Contains(ev.Data, "ping") {
					os.WriteFile(seen, nil, 0o600)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if e.Error != nil || e.Text != "True" || e.Stdout != "ping\n" {
				t.Fatalf("the output did not come while the cell ran: %+v", e)
			}
		})
	}

	// What a subprocess writes before the cell ends is all in the cell's
	// output, however far behind ipykernel's reader of the pipe is.
	t.Run("SubprocessOutputWhole", func(t *testing.T) {
		var want strings.Builder
		for i := 1; i <= 20000; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		for i := range 3 {
			e, _ := runCode(t, k, "import subprocess\n_ = subprocess.run(['seq', '1', '20000'])", ExecOptions{})
			if e.Error != nil || e.Stdout != want.String() {
				t.Fatalf("run %d: %d of %d bytes, error %+v", i, len(e.Stdout), want.Len(), e.Error)
			}
		}
		mustText(t, k, "1 + 1", "2") // and nothing of it comes after
	})

	// A UTF-8 character written in two pieces comes out whole.
	t.Run("SplitCharacter", func(t *testing.T) {
		e, _ := runCode(t, k, "import os, time\nb = '\\U0001F43C'.encode()\nos.write(1, b[:2]); time.sleep(0.3); os.write(1, b[2:] + b'\\n')", ExecOptions{})
		if e.Error != nil || e.Stdout != "\U0001F43C\n" {
			t.Fatalf("%q %+v", e.Stdout, e.Error)
		}
	})

	// A character a cell begins and never finishes is that cell's, not
	// the next one's.
	t.Run("CharacterCutAtTheEnd", func(t *testing.T) {
		e, _ := runCode(t, k, "import os\nos.write(1, '\\U0001F43C'.encode()[:2])", ExecOptions{})
		if e.Error != nil || e.Stdout != "\uFFFD" {
			t.Fatalf("the cell that cut it: %q %+v", e.Stdout, e.Error)
		}
		e, _ = runCode(t, k, "import os\nos.write(1, '\\U0001F43C'.encode()[2:] + b'|next\\n')", ExecOptions{})
		if e.Error != nil || strings.Contains(e.Stdout, "\U0001F43C") || !strings.HasSuffix(e.Stdout, "|next\n") {
			t.Fatalf("the next cell: %q %+v", e.Stdout, e.Error)
		}
	})

	t.Run("Printing", func(t *testing.T) {
		e, evs := runCode(t, k, "for i in range(3):\n    print(i)\n'done'", ExecOptions{})
		if e.Stdout != "0\n1\n2\n" || e.Text != "'done'" {
			t.Fatalf("%+v", e)
		}
		var types []string
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
		if i := slices.Index(types, "result"); i < 0 || slices.Index(types, "stdout") > i {
			t.Errorf("events out of order: %v", types)
		}
	})

	// A forked child's output comes back through the IOPub thread; the
	// cell's own messages stay behind it.
	t.Run("ForkedChild", func(t *testing.T) {
		for i := range 3 {
			e, _ := runCode(t, k, "import multiprocessing as mp\np = mp.get_context('fork').Process(target=print, args=('from child',))\np.start(); p.join(); p.exitcode", ExecOptions{})
			if e.Error != nil || e.Text != "0" || e.Stdout != "from child\n" {
				t.Fatalf("run %d: %+v", i, e)
			}
		}
		mustText(t, k, "1 + 1", "2")
	})
}

// pyString quotes s as a Python string literal (JSON's is one).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A SIGHUP does not end a Python kernel (job control sent one when the
// agent's freeze killed a cell's children, and the kernel died with its
// state); what the kernel starts still gets SIGHUP's default action.
func TestPythonKernelOutlivesSIGHUP(t *testing.T) {
	k := startKernel(t)
	runCode(t, k, "x = 41", ExecOptions{})
	in, err := k.current()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(in.proc.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if e, _ := runCode(t, k, "x", ExecOptions{}); e.Error != nil || e.Text != "41" {
		t.Fatalf("after a SIGHUP: %+v", e)
	}
	code := "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import signal; print(signal.getsignal(signal.SIGHUP) == signal.SIG_DFL)'], capture_output=True, text=True).stdout.strip()"
	if e, _ := runCode(t, k, code, ExecOptions{}); e.Text != "'True'" {
		t.Errorf("a child's SIGHUP: %+v, want the default", e)
	}
}
