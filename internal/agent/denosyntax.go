package agent

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// denoExplain names the syntax error of a JavaScript or TypeScript cell
// (parsed as ext: "ts" takes both): Deno's kernel answers one with "Execution failed"
// and nothing else, which leaves an agent nothing to fix its code by. The
// cell is parsed again by `deno fmt` (a parse, nothing run; no config
// file read), as the sandbox user, and its message, with the line and the
// column, becomes the error. nil when the error is not that one, or deno
// finds none. Started with os/exec, not the agent's Reaper: should the
// reaper take its exit first, Wait fails and the answer is still read
// from what deno wrote, which is all the check looks at.
func denoExplain(deno, ext string) func(ctx context.Context, code string, e *agentproto.ExecutionError) *agentproto.ExecutionError {
	return func(ctx context.Context, code string, e *agentproto.ExecutionError) *agentproto.ExecutionError {
		if e.Name != "Error" || e.Value != "Execution failed" || e.Traceback != "" {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, denoExplainTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, deno, "fmt", "--no-config", "--ext", ext, "-")
		cmd.Stdin = strings.NewReader(code)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Dir = os.TempDir()
		cmd.Env = []string{"NO_COLOR=1", "DENO_NO_UPDATE_CHECK=1", "DENO_DIR=" + os.TempDir() + "/.deno-fmt", "HOME=" + os.TempDir()}
		cmd.SysProcAttr = procAttr(false)
		if err := cmd.Run(); err == nil || ctx.Err() != nil {
			return nil // it parses: the failure is something else
		}
		return denoSyntaxError(stderr.String())
	}
}

// denoExplainTimeout bounds the parse (about 70 ms here).
const denoExplainTimeout = 10 * time.Second

// denoStdin is how deno names the code it read on stdin.
var denoStdin = regexp.MustCompile(`file://\S*_stdin\.[jt]s`)

// denoSyntaxError turns what `deno fmt` says of code it cannot parse
// ("error: SyntaxError: Expression expected", the line with a caret, "at
// file:///…/_stdin.ts:1:9") into the cell's error: SyntaxError, its
// message, and the rest (the cell's line, where) as the traceback.
func denoSyntaxError(out string) *agentproto.ExecutionError {
	out = strings.TrimSpace(denoStdin.ReplaceAllString(out, "cell"))
	first, rest, _ := strings.Cut(out, "\n")
	first = strings.TrimPrefix(first, "error: ")
	name, msg, ok := strings.Cut(first, ": ")
	if !ok || !strings.HasSuffix(name, "Error") || strings.Contains(name, " ") {
		return nil
	}
	tb := strings.TrimRight(rest, "\n")
	if tb == "" {
		tb = first
	} else {
		tb = first + "\n" + tb
	}
	return &agentproto.ExecutionError{Name: name, Value: msg, Traceback: tb}
}

// denoPath is the deno binary a kernel's argv runs, "" if none.
func denoPath(argv []string) string {
	for _, a := range argv {
		if strings.HasSuffix(a, "/deno") || a == "deno" {
			if p, err := exec.LookPath(a); err == nil {
				return p
			}
		}
	}
	return ""
}
