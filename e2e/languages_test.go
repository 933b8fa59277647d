package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// errBusy stands for a run refused because its context runs another cell.
var errBusy = errors.New("busy")

// TestLanguages runs JavaScript, TypeScript and R cells in their real
// kernels (Deno's and IRkernel), each default context started on first use.
func TestLanguages(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	runIn := func(t *testing.T, lang, code string, env map[string]string) *client.Execution {
		t.Helper()
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: code, Language: lang, Env: env, TimeoutSeconds: 120})
		if err != nil {
			t.Fatalf("%s %q: %v", lang, code, err)
		}
		if ex.Error != nil {
			t.Fatalf("%s %q: %+v", lang, code, ex.Error)
		}
		return ex
	}
	// Python first, as in a sandbox restored from the warm snapshot, whose
	// default Python context already exists.
	runIn(t, "python", "1", nil)

	t.Run("javascript: top-level await and an npm import", func(t *testing.T) {
		ex := runIn(t, "javascript", `import { chunk } from "npm:lodash-es@4.17.21";
const v = await Promise.resolve(21);
console.log("doubled", v * 2);
JSON.stringify(chunk([1, 2, 3, 4], 2))`, nil)
		if ex.Stdout != "doubled 42\n" || ex.Text != `"[[1,2],[3,4]]"` {
			t.Fatalf("stdout %q text %q", ex.Stdout, ex.Text)
		}
		// State persists in the default context.
		if ex := runIn(t, "javascript", "v + 1", nil); ex.Text != "22" {
			t.Fatalf("v + 1 = %q", ex.Text)
		}
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "throw new TypeError('bad')", Language: "javascript"})
		if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Name+ex.Error.Value, "bad") {
			t.Fatalf("throw: %+v %v", ex.Error, err)
		}
		// A syntax error says what and where (Deno's kernel says only
		// "Execution failed"), also to a streamed run, as an error event.
		jc, err := c.CreateContext(ctx, sb.ID, "javascript", "")
		if err != nil {
			t.Fatal(err)
		}
		var events []string
		ex, err = c.RunStream(ctx, sb.ID, jc.ID, client.RunRequest{Code: "const ok = 1;\nlet q = ;"}, func(ev client.CodeEvent) { events = append(events, ev.Type) })
		if err != nil || ex.Error == nil || ex.Error.Name != "SyntaxError" || ex.Error.Value != "Expression expected" || !strings.Contains(ex.Error.Traceback, "let q = ;") || !strings.Contains(ex.Error.Traceback, "cell:2:9") {
			t.Fatalf("syntax error: %+v %v", ex.Error, err)
		}
		if !slices.Contains(events, "error") {
			t.Errorf("a streamed syntax error sent no error event: %v", events)
		}
		if err := c.DeleteContext(ctx, sb.ID, jc.ID); err != nil {
			t.Fatal(err)
		}
		// A timeout interrupts the loop (an interrupt_request: SIGINT would
		// kill Deno's kernel) and the state survives.
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "while (true) {}", Language: "javascript", TimeoutSeconds: 2})
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" || strings.Contains(ex.Error.Value, "restarted") {
			t.Fatalf("busy loop: %+v %v", ex.Error, err)
		}
		if ex := runIn(t, "javascript", "v", nil); ex.Text != "21" {
			t.Fatalf("v after the timeout = %q", ex.Text)
		}
	})
	t.Run("typescript: types, and two first runs at once", func(t *testing.T) {
		// Both runs make the default context on first use. The second waits
		// for the kernel the first starts (it was refused with 409 "still
		// starting"), then one cell runs at a time as in any context: each
		// run either answers or is refused as busy, never more.
		cells := map[string]string{
			"5": `interface P { x: number; y: number }
const norm = (p: P): number => Math.hypot(p.x, p.y);
norm({ x: 3, y: 4 })`,
			"42": "const other: number = 6 * 7; other",
		}
		errs := make(chan error, len(cells))
		for want, code := range cells {
			go func() {
				ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: code, Language: "typescript", TimeoutSeconds: 120})
				switch {
				case err != nil && strings.Contains(err.Error(), "busy running other code"):
					err = errBusy
				case err == nil && (ex.Error != nil || ex.Text != want):
					err = fmt.Errorf("error %+v, text %q, want %s", ex.Error, ex.Text, want)
				}
				errs <- err
			}()
		}
		ran := 0
		for range cells {
			switch err := <-errs; err {
			case nil:
				ran++
			case errBusy:
			default:
				t.Errorf("a first run: %v", err)
			}
		}
		if ran == 0 {
			t.Fatal("neither first run ran")
		}
		if ex := runIn(t, "typescript", "Math.hypot(6, 8) as number", nil); ex.Text != "10" {
			t.Fatalf("a run after the first runs (%d ran): text %q, stdout %q, stderr %q, %d results, count %d", ran, ex.Text, ex.Stdout, ex.Stderr, len(ex.Results), ex.ExecutionCount)
		}
	})
	t.Run("r: a data frame and a base plot", func(t *testing.T) {
		ex := runIn(t, "r", `df <- data.frame(city = c("Oslo", "Lima"), temp = c(3.5, 19))
print(df)
mean(df$temp)`, nil)
		// IRkernel shows a cell's value as a display, not as an execute_result.
		// Its last visible value is the main result, and so the text.
		if !strings.Contains(ex.Stdout, "Oslo") || !strings.Contains(ex.Stdout, "19.0") || len(ex.Results) != 1 || ex.Results[0].Text != "[1] 11.25" ||
			!ex.Results[0].IsMainResult || ex.Text != "[1] 11.25" {
			t.Fatalf("stdout %q text %q results %+v", ex.Stdout, ex.Text, ex.Results)
		}
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "Sys.sleep(60)", Language: "r", TimeoutSeconds: 2})
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" || strings.Contains(ex.Error.Value, "restarted") {
			t.Fatalf("R timeout: %+v %v", ex.Error, err)
		}
		ex = runIn(t, "r", `plot(1:10, (1:10)^2)`, nil)
		if ex.PNG == "" {
			t.Fatalf("no PNG from a base plot: %+v", ex.Results)
		}
	})
	t.Run("env per run", func(t *testing.T) {
		env := map[string]string{"PANDA_VAR": `a "quoted" <value>\`}
		want := env["PANDA_VAR"]
		if ex := runIn(t, "javascript", `Deno.env.get("PANDA_VAR")`, env); ex.Text != `'a "quoted" <value>\\'` {
			t.Errorf("javascript: %q", ex.Text)
		}
		if ex := runIn(t, "javascript", `String(Deno.env.get("PANDA_VAR"))`, nil); ex.Text != `"undefined"` {
			t.Errorf("javascript after the run: %q", ex.Text)
		}
		if ex := runIn(t, "r", `cat(Sys.getenv("PANDA_VAR"))`, env); ex.Stdout != want {
			t.Errorf("r: %q", ex.Stdout)
		}
		if ex := runIn(t, "r", `cat(Sys.getenv("PANDA_VAR", "unset"))`, nil); ex.Stdout != "unset" {
			t.Errorf("r after the run: %q", ex.Stdout)
		}
		if ex := runIn(t, "python", `import os; os.environ["PANDA_VAR"]`, env); ex.Text != `'a "quoted" <value>\\'` {
			t.Errorf("python: %q", ex.Text)
		}
	})
	t.Run("contexts are listed oldest first, defaults included", func(t *testing.T) {
		mine, err := c.CreateContext(ctx, sb.ID, "r", "")
		if err != nil {
			t.Fatal(err)
		}
		status, body := rawCall(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/contexts", "")
		var got struct {
			Contexts []client.Context `json:"contexts"`
		}
		if status != 200 || json.Unmarshal(body, &got) != nil {
			t.Fatalf("list: %d %s", status, body)
		}
		var ids []string
		for _, cc := range got.Contexts {
			ids = append(ids, cc.ID+"/"+cc.Language)
		}
		// In the order they were made: the default contexts on first use.
		want := []string{"ctx_default_python/python", "ctx_default_javascript/javascript", "ctx_default_typescript/typescript", "ctx_default_r/r", mine.ID + "/r"}
		if strings.Join(ids, " ") != strings.Join(want, " ") {
			t.Fatalf("contexts %v, want %v", ids, want)
		}
	})
	t.Run("input ends at once: bash read, R readline", func(t *testing.T) {
		// The kernels have no terminal input: a cell that reads ends now,
		// not when it times out (runIn's timeout is 120 s, this one 20 s).
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "cd /tmp\nread x; echo \"got[$x] $?\"\nf() { echo kept; }", Language: "bash", TimeoutSeconds: 20})
		if err != nil || ex.Error != nil || ex.Stdout != "got[] 1\n" {
			t.Fatalf("bash read: %+v %+v %v", ex, ex.Error, err)
		}
		// What the cell set stays for the next one.
		if ex := runIn(t, "bash", "pwd; f", nil); ex.Stdout != "/tmp\nkept\n" {
			t.Errorf("bash after a wrapped cell: %q", ex.Stdout)
		}
		if ex := runIn(t, "bash", "# a cell of comments only", nil); ex.Error != nil {
			t.Errorf("a bash cell of comments: %+v", ex.Error)
		}
		// A failed last command is an error named Error, its value the exit
		// status; an exit ends the shell, which the run says.
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "false", Language: "bash"})
		if err != nil || ex.Error == nil || ex.Error.Name != "Error" || ex.Error.Value != "1" {
			t.Errorf("bash false: %+v %v", ex.Error, err)
		}
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "y=set; exit 3", Language: "bash"})
		if err != nil || ex.Error == nil || ex.Error.Name != "ShellExited" {
			t.Errorf("bash exit: %+v %v", ex.Error, err)
		}
		if ex := runIn(t, "bash", "echo ${y:-gone}", nil); ex.Stdout != "gone\n" {
			t.Errorf("bash after an exit: %q", ex.Stdout)
		}
		// The kernel's restart line printed by a cell is only output; an
		// exit after more output than the cap keeps is still seen.
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "y=kept; echo 'Restarting Bash'", Language: "bash"})
		if err != nil || ex.Error != nil || ex.Stdout != "Restarting Bash\n" {
			t.Errorf("bash printing the restart line: %q %+v %v", ex.Stdout, ex.Error, err)
		}
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "echo ${y:-gone}; head -c 2000000 /dev/zero | tr '\\0' y; echo; exit", Language: "bash"})
		if err != nil || ex.Error == nil || ex.Error.Name != "ShellExited" || !strings.HasPrefix(ex.Stdout, "kept\nyyy") {
			t.Errorf("bash exit after a flood: %.20q %+v %v", ex.Stdout, ex.Error, err)
		}
		ex, err = c.RunCode(ctx, sb.ID, client.RunRequest{Code: "rm(list = ls())\nx <- readline(\"name? \")", Language: "r", TimeoutSeconds: 20})
		if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Value, "no input") {
			t.Fatalf("R readline: %+v %v", ex, err)
		}
	})
}
