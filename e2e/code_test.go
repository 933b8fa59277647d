package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image/png"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// codeSandbox creates a code-interpreter sandbox and a Python context.
func codeSandbox(t *testing.T, s *server) (*client.Sandbox, *client.Context) {
	t.Helper()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	cc, err := s.client().CreateContext(context.Background(), sb.ID, "python", "")
	if err != nil {
		t.Fatalf("create context: %v\n%s", err, tail(s.out.String(), 30))
	}
	return sb, cc
}

func run(t *testing.T, c *client.Client, sb *client.Sandbox, cc *client.Context, code string, timeout float64) *client.Execution {
	t.Helper()
	ex, err := c.Run(context.Background(), sb.ID, cc.ID, client.RunRequest{Code: code, TimeoutSeconds: timeout})
	if err != nil {
		t.Fatalf("run %q: %v", code, err)
	}
	return ex
}

func TestCodeContexts(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb, cc := codeSandbox(t, s)

	t.Run("state persists", func(t *testing.T) {
		run(t, c, sb, cc, "x = 41", 0)
		ex := run(t, c, sb, cc, "x + 1", 0)
		if ex.Text != "42" || ex.Error != nil || len(ex.Results) != 1 || !ex.Results[0].IsMainResult {
			t.Fatalf("x + 1 = %+v", ex)
		}
	})
	t.Run("contexts are separate", func(t *testing.T) {
		other, err := c.CreateContext(ctx, sb.ID, "python", "")
		if err != nil {
			t.Fatal(err)
		}
		ex := run(t, c, sb, other, "x", 0)
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Fatalf("x in another context: %+v", ex)
		}
		if err := c.DeleteContext(ctx, sb.ID, other.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Run(ctx, sb.ID, other.ID, client.RunRequest{Code: "1"}); !client.IsCode(err, "not_found") {
			t.Fatalf("run on a deleted context: %v", err)
		}
	})
	t.Run("print streams live", func(t *testing.T) {
		start := time.Now()
		var first time.Duration
		ex, err := c.RunStream(ctx, sb.ID, cc.ID, client.RunRequest{Code: "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)"}, func(ev client.CodeEvent) {
			if ev.Type == "stdout" && first == 0 {
				first = time.Since(start)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Stdout != "0\n1\n2\n" || first == 0 || first > time.Since(start)-700*time.Millisecond {
			t.Fatalf("stdout %q, first chunk at %s of %s", ex.Stdout, first, time.Since(start))
		}
	})
	t.Run("DataFrame gives text and HTML", func(t *testing.T) {
		ex := run(t, c, sb, cc, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})", 60)
		if ex.Error != nil || !strings.Contains(ex.Text, "a  b") || len(ex.Results) == 0 || !strings.Contains(ex.Results[0].HTML, "<table") {
			t.Fatalf("DataFrame: %+v", ex)
		}
	})
	t.Run("plt.show gives a PNG", func(t *testing.T) {
		ex := run(t, c, sb, cc, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()", 120)
		if ex.Error != nil || ex.PNG == "" {
			t.Fatalf("plot: %+v", ex.Error)
		}
		raw, err := base64.StdEncoding.DecodeString(ex.PNG)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil || len(raw) < 1024 || img.Bounds().Dx() < 100 {
			t.Fatalf("PNG: %d bytes, err %v", len(raw), err)
		}
	})
	t.Run("plotly show gives Plotly JSON, HTML and a PNG", func(t *testing.T) {
		ex := run(t, c, sb, cc, "import plotly.express as px\npx.line(x=[1, 2, 3], y=[3, 1, 2]).show()", 180)
		if ex.Error != nil {
			t.Fatalf("plotly: %+v", ex.Error)
		}
		if len(ex.Results) != 1 {
			t.Errorf("plotly's first show gave %d results, not one", len(ex.Results))
		}
		var found bool
		for _, r := range ex.Results {
			if r.Plotly != nil && strings.Contains(r.HTML, "<div") && r.PNG != "" {
				raw, err := base64.StdEncoding.DecodeString(r.PNG)
				if _, perr := png.Decode(bytes.NewReader(raw)); err != nil || perr != nil {
					t.Fatalf("plotly PNG does not decode: %v %v", err, perr)
				}
				found = true
			}
		}
		if !found {
			t.Fatalf("no result with plotly JSON, HTML and PNG: %+v", ex.Results)
		}
	})
	t.Run("a subprocess's output is whole", func(t *testing.T) {
		// More than ipykernel's reader of the process's stdout has read when
		// the subprocess ends, and a character split between two writes.
		var want strings.Builder
		for i := 1; i <= 20000; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		ex := run(t, c, sb, cc, "import subprocess\n_ = subprocess.run(['seq', '1', '20000'])", 0)
		if ex.Error != nil || ex.Stdout != want.String() {
			t.Fatalf("%d of %d bytes, error %+v", len(ex.Stdout), want.Len(), ex.Error)
		}
		ex = run(t, c, sb, cc, "import subprocess\n_ = subprocess.run(['python3', '-c', 'print(\"\u4e16\u754c\" * 3000)'])", 0)
		if ex.Error != nil || ex.Stdout != strings.Repeat("\u4e16\u754c", 3000)+"\n" {
			t.Fatalf("CJK from a subprocess: %d bytes, %d U+FFFD, error %+v", len(ex.Stdout), strings.Count(ex.Stdout, "\uFFFD"), ex.Error)
		}
	})
	t.Run("exception", func(t *testing.T) {
		ex := run(t, c, sb, cc, "def f():\n    raise ValueError('bad value')\nf()", 0)
		if ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "bad value" ||
			!strings.Contains(ex.Error.Traceback, "ValueError") || strings.Contains(ex.Error.Traceback, "\x1b[") {
			t.Fatalf("error = %+v", ex.Error)
		}
		if again := run(t, c, sb, cc, "x", 0); again.Text != "41" {
			t.Fatalf("context unusable after an exception: %+v", again)
		}
	})
	t.Run("syntax error", func(t *testing.T) {
		ex := run(t, c, sb, cc, "def (", 0)
		if ex.Error == nil || ex.Error.Name != "SyntaxError" {
			t.Fatalf("error = %+v", ex.Error)
		}
	})
	t.Run("timeout interrupts and keeps state", func(t *testing.T) {
		start := time.Now()
		// 5 s: the interrupt must come after the print, on a loaded host too.
		ex := run(t, c, sb, cc, "print('before', flush=True)\nimport time\ntime.sleep(60)", 5)
		if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Stdout, "before") || time.Since(start) > 15*time.Second {
			t.Fatalf("timeout: %+v after %s", ex, time.Since(start))
		}
		if again := run(t, c, sb, cc, "x", 0); again.Text != "41" {
			t.Fatalf("state after timeout: %+v", again)
		}
		ex = run(t, c, sb, cc, "while True: pass", 2)
		if ex.Error == nil || ex.Error.Name != "TimeoutError" {
			t.Fatalf("busy loop: %+v", ex.Error)
		}
	})
	t.Run("timeout of a cell held up by its children keeps state", func(t *testing.T) {
		// system() ignores SIGINT while its child runs, and the child
		// ignores it too: the interrupt cannot end the cell. Killing
		// what the kernel started lets it end, before a restart would
		// have lost the kernel's state.
		start := time.Now()
		ex := run(t, c, sb, cc, `import os
os.system('trap "" INT; sleep 100; echo never')`, 5)
		if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "were killed") || strings.Contains(ex.Stdout, "never") || time.Since(start) > 60*time.Second {
			t.Fatalf("timeout: %+v (error %+v) after %s", ex, ex.Error, time.Since(start))
		}
		if again := run(t, c, sb, cc, "x", 0); again.Text != "41" {
			t.Fatalf("state after the timeout: %+v", again)
		}
	})
	t.Run("a run right after a cancelled one waits for it", func(t *testing.T) {
		for i := range 3 {
			short, cancel := context.WithTimeout(ctx, time.Second)
			ex, err := c.Run(short, sb.ID, cc.ID, client.RunRequest{Code: "import time\ntime.sleep(15)"})
			cancel()
			if err == nil {
				t.Fatalf("a 15 s cell answered within its caller's 1 s: %+v (error %+v)", ex, ex.Error)
			}
			if ex, err := c.Run(ctx, sb.ID, cc.ID, client.RunRequest{Code: "'next'"}); err != nil || ex.Text != "'next'" {
				t.Fatalf("the run right after a cancelled one (%d): %+v %v", i, ex, err)
			}
		}
	})
	t.Run("input does not hang", func(t *testing.T) {
		ex := run(t, c, sb, cc, "input('name? ')", 20)
		if ex.Error == nil || ex.Error.Name == "TimeoutError" {
			t.Fatalf("input(): %+v", ex.Error)
		}
		// Nor does a shell command that reads its input.
		ex = run(t, c, sb, cc, "!cat; echo done", 20)
		if ex.Error != nil || strings.TrimSpace(ex.Stdout) != "done" {
			t.Fatalf("!cat: %+v", ex)
		}
	})
	t.Run("half a character", func(t *testing.T) {
		ex := run(t, c, sb, cc, "print('cut \\ud83d here')\nprint('after')", 20)
		if ex.Error != nil || ex.Stdout != "cut \ufffd here\nafter\n" {
			t.Fatalf("a lone surrogate: %+v", ex)
		}
	})
	t.Run("an await interrupted", func(t *testing.T) {
		run(t, c, sb, cc, "awaited = 'kept'", 0)
		ex := run(t, c, sb, cc, "import asyncio\nawait asyncio.sleep(60)", 5)
		if ex.Error == nil || ex.Error.Name != "TimeoutError" || strings.Contains(ex.Error.Value, "restarted") {
			t.Fatalf("await past its timeout: %+v", ex.Error)
		}
		if ex := run(t, c, sb, cc, "awaited", 20); ex.Text != "'kept'" {
			t.Fatalf("after the await's timeout: %+v", ex)
		}
	})
	t.Run("kernel death and restart", func(t *testing.T) {
		ex := run(t, c, sb, cc, "import os\nos._exit(1)", 30)
		if ex.Error == nil || ex.Error.Name != "KernelDied" {
			t.Fatalf("os._exit: %+v", ex.Error)
		}
		if _, err := c.RestartContext(ctx, sb.ID, cc.ID); err != nil {
			t.Fatal(err)
		}
		ex = run(t, c, sb, cc, "1 + 1", 30)
		if ex.Text != "2" {
			t.Fatalf("after restart: %+v", ex)
		}
		run(t, c, sb, cc, "x = 41", 0)
	})
	t.Run("output is capped", func(t *testing.T) {
		ex := run(t, c, sb, cc, "print('y' * 3_000_000)", 60)
		if len(ex.Stdout) > (1<<20)+200 || !strings.Contains(ex.Stdout, "truncated") {
			t.Fatalf("3 MB print kept %d bytes", len(ex.Stdout))
		}
	})
	t.Run("rich results are capped", func(t *testing.T) {
		ex := run(t, c, sb, cc, "from IPython.display import HTML, display\nfor i in range(50):\n    display(HTML('x' * 1_000_000))\n'done'", 120)
		total, marker := 0, false
		for _, r := range ex.Results {
			total += len(r.HTML) + len(r.Text)
			marker = marker || strings.Contains(r.Text, "results truncated")
		}
		if ex.Error != nil || total > 33<<20 || !marker || ex.Text != "'done'" {
			t.Fatalf("50 MB of displays: error %+v, %d results, %d bytes kept, marker %v, text %q", ex.Error, len(ex.Results), total, marker, ex.Text)
		}
	})
	t.Run("run_code default context and bash", func(t *testing.T) {
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "y = 7"})
		if err != nil {
			t.Fatal(err)
		}
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "y * 6"})
		if err != nil || ex.Text != "42" {
			t.Fatalf("default context: %+v %v", ex, err)
		}
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "echo from-bash-$((6*7))", Language: "bash"})
		if err != nil || !strings.Contains(ex.Stdout, "from-bash-42") {
			t.Fatalf("bash: %+v %v", ex, err)
		}
	})
	t.Run("bash timeout of a cell held up by its children keeps the shell", func(t *testing.T) {
		bash, err := c.CreateContext(ctx, sb.ID, "bash", "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.DeleteContext(ctx, sb.ID, bash.ID)
		run(t, c, sb, bash, "x=kept", 0)
		// A subshell that ignores the interrupt, as its sleep does: what
		// the shell started is killed, the shell with its variables is not.
		start := time.Now()
		// nev""er: bash's job reports ("[1]+ Killed (…)") quote the
		// command, which must not pass for its output.
		ex := run(t, c, sb, bash, `(trap "" INT; sleep 100; echo nev""er)`, 5)
		if ex.Error == nil || ex.Error.Name != "TimeoutError" || !strings.Contains(ex.Error.Value, "were killed") || strings.Contains(ex.Stdout, "never") || time.Since(start) > 60*time.Second {
			t.Fatalf("timeout: %+v (error %+v) after %s", ex, ex.Error, time.Since(start))
		}
		if again := run(t, c, sb, bash, "echo $x", 0); again.Error != nil || again.Stdout != "kept\n" {
			t.Fatalf("the shell after the timeout: %+v", again)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		if _, err := c.CreateContext(ctx, sb.ID, "cobol", ""); !client.IsCode(err, "invalid_request") || !strings.Contains(err.Error(), "python") {
			t.Errorf("unknown language: %v", err)
		}
		if _, err := c.Run(ctx, sb.ID, "ctx_nope", client.RunRequest{Code: "1"}); !client.IsCode(err, "not_found") {
			t.Errorf("unknown context: %v", err)
		}
		status, code, _ := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/contexts/"+cc.ID+"/run", `{"code": 42}`)
		if status != 400 || code != "invalid_request" {
			t.Errorf("code not a string: %d %s", status, code)
		}
	})
}
