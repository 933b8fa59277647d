package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// waitWarmTemplate waits until the server has the warm snapshot of a
// template (serve makes it in the background after it starts).
func waitWarmTemplate(t *testing.T, s *server, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Minute)
	for {
		var out struct {
			Templates []struct {
				Name string `json:"name"`
				Warm bool   `json:"warm"`
			} `json:"templates"`
		}
		rawJSON(t, s, "GET", "/v1/templates", "", &out)
		for _, tp := range out.Templates {
			if tp.Name == name && tp.Warm {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("template %s never became warm:\n%s", name, tail(s.out.String(), 40))
		}
		time.Sleep(time.Second)
	}
}

// warmProbe is a first cell that says what the kernel had imported before
// it, which backend matplotlib uses, and who the kernel is.
const warmProbe = `import sys, os
import matplotlib
print(",".join(m for m in ("numpy", "pandas", "matplotlib.pyplot") if m in sys.modules))
print(matplotlib.get_backend())
print(os.environ.get("PANDASTACK_SANDBOX_ID"))
print(os.getpid())
import random, numpy
print(random.random(), numpy.random.rand())`

// probe runs warmProbe as the context's first cell and returns its lines.
func probe(t *testing.T, c *client.Client, sb *client.Sandbox, cc *client.Context) (imported, backend, sandboxID, pid string, count int) {
	t.Helper()
	ex := run(t, c, sb, cc, warmProbe, 120)
	lines := strings.Split(strings.TrimSpace(ex.Stdout), "\n")
	if ex.Error != nil || len(lines) != 5 {
		t.Fatalf("probe: %+v", ex)
	}
	lastRandom = lines[4]
	return lines[0], lines[1], lines[2], lines[3], ex.ExecutionCount
}

// lastRandom is the random numbers the last probe drew.
var lastRandom string

// TestWarmContexts: in a sandbox of a warm template, a new code context is
// a kernel that already ran the template's warm-up (numpy, pandas and
// matplotlib imported, the inline backend on), yet shares nothing with the
// other contexts; once handed out, a replacement is warmed up in the
// background for the next one.
func TestWarmContexts(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	waitWarmTemplate(t, s, "code-interpreter")
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})

	a, err := c.CreateContext(ctx, sb.ID, "python", "")
	if err != nil {
		t.Fatal(err)
	}
	imported, backend, id, pidA, count := probe(t, c, sb, a)
	randomA := lastRandom
	if imported != "numpy,pandas,matplotlib.pyplot" || !strings.Contains(backend, "inline") {
		t.Fatalf("a new context had imported %q before its first cell, backend %q: not warm", imported, backend)
	}
	if id != sb.ID {
		t.Fatalf("the kernel of a new context thinks its sandbox is %q, not %s", id, sb.ID)
	}
	if count != 1 {
		t.Fatalf("the first cell of a new context has execution count %d, want 1 (the warm-up must not count)", count)
	}
	ex := run(t, c, sb, a, "secret = 42\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()", 60)
	if ex.Error != nil || len(ex.Results) != 1 || ex.Results[0].PNG == "" {
		t.Fatalf("a plot in a warm context: %+v", ex)
	}

	// Contexts share nothing: not the variables, not the process.
	b, err := c.CreateContext(ctx, sb.ID, "python", "")
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(s.out.String(), 60))
	}
	_, _, _, pidB, _ := probe(t, c, sb, b)
	if pidB == pidA {
		t.Fatalf("two contexts run in one kernel process (pid %s)", pidA)
	}
	if ex := run(t, c, sb, b, "'secret' in globals()", 30); ex.Text != "False" {
		t.Fatalf("a variable of one context is seen in another: %+v", ex)
	}
	for _, cc := range []*client.Context{a, b} {
		if err := c.DeleteContext(ctx, sb.ID, cc.ID); err != nil {
			t.Fatal(err)
		}
	}

	// The spare handed out is replaced once the sandbox is quiet: a later
	// context is warm again, and clean.
	untilWarmContext(t, c, sb, "after the spare was handed out", func(later *client.Context, pid string) {
		if ex := run(t, c, sb, later, "'secret' in globals()", 30); ex.Text != "False" {
			t.Fatalf("a variable of a deleted context is seen in a later one: %+v", ex)
		}
		if pid == pidA || pid == pidB {
			t.Fatalf("a later context reuses the kernel process %s of a deleted one", pid)
		}
	})

	// The default context (run_code without one) is as warm, in a sandbox
	// of its own.
	sb2 := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	ex, err = c.RunCode(ctx, sb2.ID, client.RunRequest{Code: warmProbe, TimeoutSeconds: 120})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(ex.Stdout, "\n")
	if ex.Error != nil || len(lines) < 5 || lines[0] != "numpy,pandas,matplotlib.pyplot" || lines[2] != sb2.ID {
		t.Fatalf("the default context's first cell: %+v", ex)
	}
	// Both kernels come from one warm image, yet draw different numbers.
	if lines[4] == randomA {
		t.Fatalf("warm kernels of two sandboxes share their random state: both drew %s", randomA)
	}

	// A context with a cwd of its own starts its own kernel, in that cwd.
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "mkdir -p /home/user/work"}); err != nil {
		t.Fatal(err)
	}
	w, err := c.CreateContext(ctx, sb.ID, "python", "/home/user/work")
	if err != nil {
		t.Fatal(err)
	}
	if ex := run(t, c, sb, w, "import os; os.getcwd()", 60); ex.Text != "'/home/user/work'" {
		t.Fatalf("cwd of a context: %+v", ex)
	}
}

// untilWarmContext creates, probes (then check, if not nil) and deletes new
// contexts in sb until one is warm (the warm-up's imports done), as once the
// agent has a spare again; it fails after 3 minutes. when says after what.
func untilWarmContext(t *testing.T, c *client.Client, sb *client.Sandbox, when string, check func(cc *client.Context, pid string)) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		cc, err := c.CreateContext(context.Background(), sb.ID, "python", "")
		if err != nil {
			t.Fatal(err)
		}
		imported, _, id, pid, _ := probe(t, c, sb, cc)
		if id != sb.ID {
			t.Fatalf("the kernel of a new context thinks its sandbox is %q, not %s", id, sb.ID)
		}
		if check != nil {
			check(cc, pid)
		}
		if err := c.DeleteContext(context.Background(), sb.ID, cc.ID); err != nil {
			t.Fatal(err)
		}
		if imported == "numpy,pandas,matplotlib.pyplot" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warm context again %s (last had %q imported)", when, imported)
		}
		time.Sleep(2 * time.Second)
	}
}

// TestForkChildrenWarmContexts: a fork taken while the parent's replacement
// spare is likely still starting (its first context took the spare; the
// replacement starts 2 s later and takes seconds) gives children that
// answer with the parent's state, each its own. The fork has the parent's
// agent give that start up (its hold of the spares); the children's new
// contexts are warm again once they are quiet (their hello ends the hold),
// and so are the parent's (the fork ends its hold).
func TestForkChildrenWarmContexts(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	waitWarmTemplate(t, s, "code-interpreter")
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "kept = 7"}); err != nil || ex.Error != nil {
		t.Fatalf("the parent's first cell: %+v %v", ex, err)
	}
	time.Sleep(3 * time.Second)
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 2, TTLSeconds: 900})
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, tail(s.out.String(), 60))
	}
	for _, k := range kids {
		t.Cleanup(func() { c.KillSandbox(context.Background(), k.ID) })
	}
	for i, k := range kids {
		ex, err := c.RunCode(ctx, k.ID, client.RunRequest{Code: fmt.Sprintf("kept += %d\nkept", i+1)})
		if err != nil || ex.Error != nil || ex.Text != fmt.Sprint(8+i) {
			t.Fatalf("fork child %d: %+v %v\n%s", i, ex, err, tail(s.out.String(), 60))
		}
	}
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "kept"}); err != nil || ex.Text != "7" {
		t.Fatalf("the parent after its children ran: %+v %v", ex, err)
	}
	for i := range kids {
		untilWarmContext(t, c, &kids[i], fmt.Sprintf("in fork child %d", i), nil)
	}
	untilWarmContext(t, c, sb, "in the fork's parent", nil)
}

// TestForkShutsTheParentsReadySpare: a fork of a parent whose spare kernel
// is ready (started again and warmed up since its first context took the
// last one) shuts that spare down before its checkpoint, so neither the
// image nor the child holds it; both still answer with the parent's state,
// and both make warm contexts again once their spares' refills, paced by
// the server, are done.
func TestForkShutsTheParentsReadySpare(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	waitWarmTemplate(t, s, "code-interpreter")
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "kept = 7"}); err != nil || ex.Error != nil {
		t.Fatalf("the parent's first cell: %+v %v", ex, err)
	}
	waitReadySpare(t, c, sb.ID)
	// Right after the last look's exec: the fork waits for its end.
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 1, TTLSeconds: 900})
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, tail(s.out.String(), 60))
	}
	kid := &kids[0]
	t.Cleanup(func() { c.KillSandbox(context.Background(), kid.ID) })
	var line string
	for _, l := range strings.Split(s.out.String(), "\n") {
		if strings.Contains(l, `msg="sandbox forked"`) && strings.Contains(l, "sandbox="+sb.ID+" ") {
			line = l
		}
	}
	if !strings.Contains(line, " spares_released=1 ") {
		t.Fatalf("the fork's log line does not say the ready spare was shut down: %q", line)
	}
	// The child's refill waits for the server's pacer, which waits for a
	// quiet host: right after the fork it runs the parent's kernel alone.
	if n := len(kernels(t, c, kid.ID)); n != 1 {
		t.Errorf("the fork's child runs %d kernels right after the fork, want 1 (no spare in the image)", n)
	}
	if ex, err := c.RunCode(ctx, kid.ID, client.RunRequest{Code: "kept += 1\nkept"}); err != nil || ex.Error != nil || ex.Text != "8" {
		t.Fatalf("the fork's child: %+v %v", ex, err)
	}
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "kept"}); err != nil || ex.Text != "7" {
		t.Fatalf("the parent after its child ran: %+v %v", ex, err)
	}
	untilWarmContext(t, c, kid, "in the fork's child", nil)
	untilWarmContext(t, c, sb, "in the fork's parent", nil)
}

// kernels returns the resident sizes (KiB) of the Python kernels sandbox id
// runs.
func kernels(t *testing.T, c *client.Client, id string) []int {
	t.Helper()
	res, err := c.Exec(context.Background(), id, client.ExecRequest{Cmd: "ps -eo rss,args | grep '/usr/bin/python3 -Xfrozen_modules' | grep -v grep", TimeoutSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// waitReadySpare waits (3 minutes at most) until sandbox id runs two
// kernels, the smaller at least 80% of the larger's size and neither
// grown by over 1% in two seconds: its spare started and warmed up.
func waitReadySpare(t *testing.T, c *client.Client, id string) {
	t.Helper()
	var last []int
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		ks := kernels(t, c, id)
		if len(ks) == 2 && len(last) == 2 && ks[0] <= last[0]*101/100 && ks[1] <= last[1]*101/100 && 5*min(ks[0], ks[1]) >= 4*max(ks[0], ks[1]) {
			return
		}
		last = ks
	}
	t.Fatalf("no ready spare kernel in %s within 3 minutes (kernels' sizes: %v KiB)", id, last)
}

// TestKernelsShareMatplotlibsFontCache: the kernels of a sandbox share one
// matplotlib directory, so a kernel started on demand (a context with a
// cwd of its own, which no spare fits) finds the font list built and does
// not build it again (0.3-0.7 s of its start).
func TestKernelsShareMatplotlibsFontCache(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	waitWarmTemplate(t, s, "code-interpreter")
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	const look = "import glob, os, matplotlib.pyplot\nd = matplotlib.get_cachedir()\nf = glob.glob(d + '/fontlist-*.json')\nprint(d, len(f), os.stat(f[0]).st_mtime_ns if f else 0)"
	warm, err := c.CreateContext(ctx, sb.ID, "python", "")
	if err != nil {
		t.Fatal(err)
	}
	first := strings.TrimSpace(run(t, c, sb, warm, look, 60).Stdout)
	if f := strings.Fields(first); len(f) != 3 || f[1] != "1" {
		t.Fatalf("the warm context's matplotlib directory: %q, want one font list in it", first)
	}
	cold, err := c.CreateContext(ctx, sb.ID, "python", "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(run(t, c, sb, cold, look, 120).Stdout); got != first {
		t.Fatalf("a kernel started on demand: matplotlib directory, font lists and the list's mtime %q, want %q (the same list, not built again)", got, first)
	}
}
