/**
 * Code contexts (real Jupyter kernels in a code-interpreter sandbox): state,
 * rich results, errors, streaming, interrupt/restart/close.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { ConflictError, ExecutionError, NotFoundError, type Result, SandboxStoppedError } from "@pandastack/sdk";
import { assertPng, codeSandbox, startRun } from "./helpers.js";

test("code contexts", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;
  const ctx = await sb.createCodeContext({ language: "python" });

  await t.test("a context has an id, language and cwd", () => {
    assert.match(ctx.id, /^ctx_/);
    assert.equal(ctx.language, "python");
    assert.equal(ctx.cwd, "/home/user");
    assert.equal(ctx.sandboxId, sb.id);
  });

  await t.test("state persists between runs", async () => {
    const first = await ctx.runCode("x = 41\nprint('set')");
    assert.equal(first.stdout, "set\n");
    assert.equal(first.error, undefined);
    assert.equal(first.text, undefined);
    const ex = await ctx.runCode("x + 1");
    assert.equal(ex.text, "42");
    assert.equal(ex.error, undefined);
    assert.equal(ex.results.length, 1);
    assert.equal(ex.results[0]!.isMainResult, true);
    assert.equal(ex.results[0]!.text, "42");
    assert.ok(ex.executionCount > first.executionCount, `${ex.executionCount} after ${first.executionCount}`);
    assert.equal(typeof ex.durationMs, "number");
  });

  await t.test("plt.show() gives a PNG", async () => {
    const ex = await ctx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()");
    assert.equal(ex.error, undefined, String(ex.error));
    assertPng(ex.png);
    const withPng = ex.results.filter((r) => r.png);
    assert.equal(withPng.length, 1);
    assert.equal(withPng[0]!.png, ex.png);
    assert.equal(withPng[0]!.isMainResult, false);
  });

  await t.test("a Plotly figure's show() gives Plotly JSON, HTML and a PNG", async () => {
    const ex = await ctx.runCode("import plotly.express as px\npx.line(x=[1, 2, 3], y=[3, 1, 2]).show()", {
      timeout: 180,
    });
    assert.equal(ex.error, undefined, String(ex.error));
    const fig = ex.results.find((r) => r.plotly !== undefined);
    assert.ok(fig, `no plotly result among ${JSON.stringify(ex.results.map((r) => Object.keys(r)))}`);
    assert.ok(Array.isArray((fig.plotly as { data?: unknown }).data), "plotly JSON has no data array");
    assert.match(fig.html ?? "", /<div/);
    assertPng(fig.png);
  });

  await t.test("a DataFrame as last expression gives an HTML table and text", async () => {
    const ex = await ctx.runCode("import pandas as pd\npd.DataFrame({'alpha': [1, 2], 'beta': [3, 4]})");
    assert.equal(ex.error, undefined, String(ex.error));
    assert.ok(ex.results[0]?.html?.includes("<table"), `html: ${ex.results[0]?.html?.slice(0, 200)}`);
    assert.ok(ex.results[0]!.html!.includes("alpha"));
    assert.match(ex.text ?? "", /alpha\s+beta/);
  });

  await t.test("an exception comes back as error, and the context stays usable", async () => {
    const ex = await ctx.runCode("print('before')\n1 / 0");
    assert.ok(ex.error instanceof ExecutionError);
    assert.equal(ex.error.name, "ZeroDivisionError");
    assert.equal(ex.error.value, "division by zero");
    assert.match(ex.error.traceback, /ZeroDivisionError/);
    assert.doesNotMatch(ex.error.traceback, /\x1b\[/, "traceback has ANSI escapes");
    assert.match(`ERROR:\n${ex.error}`, /^ERROR:\n[\s\S]*ZeroDivisionError/);
    assert.equal(ex.stdout, "before\n");
    assert.equal((await ctx.runCode("x")).text, "41");
  });

  await t.test("a SyntaxError is an error too", async () => {
    const ex = await ctx.runCode("def broken(:\n    pass");
    assert.equal(ex.error?.name, "SyntaxError");
  });

  await t.test("streaming callbacks arrive in the order the kernel produced them", async () => {
    const events: string[] = [];
    const results: Result[] = [];
    let errorSeen: ExecutionError | undefined;
    const code = [
      "import sys, time",
      "from IPython.display import display",
      "print('one', flush=True)",
      "time.sleep(0.3)",
      "print('warn', file=sys.stderr, flush=True)",
      "time.sleep(0.3)",
      "display('shown')",
      "time.sleep(0.3)",
      "print('two', flush=True)",
      "time.sleep(0.3)",
      "raise ValueError('bad value')",
    ].join("\n");
    const ex = await ctx.runCode(code, {
      onStdout: (d) => void events.push(`stdout:${d.trim()}`),
      onStderr: (d) => void events.push(`stderr:${d.trim()}`),
      onResult: (r) => {
        results.push(r);
        events.push(`result:${r.text}`);
      },
      onError: (e) => {
        errorSeen = e;
        events.push(`error:${e.name}`);
      },
    });
    assert.deepEqual(events, ["stdout:one", "stderr:warn", "result:'shown'", "stdout:two", "error:ValueError"]);
    assert.equal(results[0]!.isMainResult, false);
    assert.ok(errorSeen instanceof ExecutionError);
    assert.equal(errorSeen.value, "bad value");
    // The returned Execution holds everything as well.
    assert.equal(ex.stdout, "one\ntwo\n");
    assert.equal(ex.stderr, "warn\n");
    assert.equal(ex.error?.name, "ValueError");
    assert.equal(ex.results.length, 1);
  });

  await t.test("print in a loop streams live", async () => {
    const start = Date.now();
    let first = 0;
    const ex = await ctx.runCode("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)", {
      onStdout: () => {
        if (!first) first = Date.now() - start;
      },
    });
    const total = Date.now() - start;
    assert.equal(ex.stdout, "0\n1\n2\n");
    assert.ok(first > 0 && first < total - 700, `first chunk at ${first} ms of ${total} ms`);
  });

  await t.test("a timeout interrupts the run; earlier variables survive", async () => {
    const ex = await ctx.runCode("import time\nprint('waiting', flush=True)\ntime.sleep(30)", { timeout: 1.5 });
    assert.equal(ex.error?.name, "TimeoutError");
    assert.equal(ex.stdout, "waiting\n");
    assert.equal((await ctx.runCode("x")).text, "41");
  });

  await t.test("interrupt stops running code; a second run meanwhile is a ConflictError", async () => {
    const running = (await startRun(ctx, "import time\nwhile True:\n    time.sleep(0.1)")).done;
    await assert.rejects(ctx.runCode("1"), (err: unknown) => {
      assert.ok(err instanceof ConflictError, String(err));
      assert.equal(err.status, 409);
      return true;
    });
    await ctx.interrupt();
    const ex = await running;
    assert.equal(ex.error?.name, "KeyboardInterrupt");
    assert.equal((await ctx.runCode("x")).text, "41");
  });

  await t.test("contexts are separate; cwd and env apply", async () => {
    const other = await sb.createCodeContext({ cwd: "/tmp", env: { PANDA_VAR: "bamboo" } });
    assert.equal(other.cwd, "/tmp");
    const ex = await other.runCode("import os\n(os.getcwd(), os.environ['PANDA_VAR'])");
    assert.equal(ex.text, "('/tmp', 'bamboo')");
    assert.equal((await other.runCode("x")).error?.name, "NameError");
    const ids = (await sb.listCodeContexts()).map((c) => c.id);
    assert.ok(ids.includes(ctx.id) && ids.includes(other.id), `contexts: ${ids.join(", ")}`);
    await other.close();
  });

  await t.test("restart loses the state", async () => {
    await ctx.restart();
    const ex = await ctx.runCode("x");
    assert.equal(ex.error?.name, "NameError");
    assert.equal((await ctx.runCode("y = 1\ny")).text, "1");
  });

  await t.test("a closed context is gone", async () => {
    await ctx.close();
    await assert.rejects(ctx.runCode("1"), NotFoundError);
    assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === ctx.id));
    await ctx.close(); // closing it again is not an error
  });

  await t.test("sandbox.runCode uses a default context that persists", async () => {
    await sb.runCode("counter = 10");
    const ex = await sb.runCode("counter += 5\ncounter", { language: "python" });
    assert.equal(ex.text, "15");
    const streamed: string[] = [];
    const ex2 = await sb.runCode("print(counter * 2)", { onStdout: (d) => void streamed.push(d) });
    assert.equal(ex2.stdout, "30\n");
    assert.deepEqual(streamed, ["30\n"]);
  });

  await t.test("sandbox.runCode can target a context", async () => {
    const c = await sb.createCodeContext();
    await c.runCode("only_here = 'yes'");
    assert.equal((await sb.runCode("only_here", { context: c })).text, "'yes'");
    assert.equal((await sb.runCode("only_here", { context: c.id })).text, "'yes'");
    assert.equal((await sb.runCode("only_here")).error?.name, "NameError");
  });

  await t.test("a bash context", async () => {
    const bash = await sb.createCodeContext({ language: "bash" });
    assert.equal(bash.language, "bash");
    await bash.runCode("GREETING=hello");
    const ex = await bash.runCode("echo $GREETING from $(whoami)");
    assert.equal(ex.stdout.trim(), "hello from user");
  });
});

test("a sandbox killed mid-run throws SandboxStoppedError from a streamed run", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;
  const ctx = await sb.createCodeContext();
  const { done, seen } = await startRun(ctx, "import time\ntime.sleep(30)");
  await sb.kill();
  await assert.rejects(done, (err: unknown) => {
    assert.ok(err instanceof SandboxStoppedError, String(err));
    assert.equal(err.code, "sandbox_stopped");
    return true;
  });
  assert.deepEqual(seen, ["started\n"]);
});

test("closing the context of a sandbox its TTL stopped is not an error; using it is", async (t) => {
  const sb = await codeSandbox(t, { ttlSeconds: 5 });
  if (!sb) return;
  const ctx = await sb.createCodeContext();
  const deadline = Date.now() + 60_000;
  for (let info = await sb.getInfo(); info.state !== "stopped"; info = await sb.getInfo()) {
    assert.ok(Date.now() < deadline, `the sandbox is still ${info.state} past its TTL`);
    await new Promise((r) => setTimeout(r, 500));
  }
  await ctx.close();
  await assert.rejects(ctx.runCode("1"), SandboxStoppedError);
});
