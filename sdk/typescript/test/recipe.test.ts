/**
 * The recipe's tool pattern (../shared/seed: "smolagents secure code
 * execution"), written in TypeScript as its TypeScript note describes:
 * one lazily-created persistent kernel, `const ex = await ctx.runCode(code)`
 * giving `{ stdout, stderr, error?, text?, png? }`.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { type CodeContext, NotFoundError, Sandbox } from "@pandastack/sdk";
import { assertPng, codeSandbox, killQuietly } from "./helpers.js";

let _ctx: CodeContext | undefined;

/** Lazily create one persistent sandbox kernel for the whole session. */
async function kernel(): Promise<CodeContext> {
  if (_ctx === undefined) {
    const sandbox = await Sandbox.create({
      template: "code-interpreter",
      ttlSeconds: 3600,
      metadata: { tool: "smolagents-run-python" },
    });
    _ctx = await sandbox.createCodeContext({ language: "python" });
  }
  return _ctx;
}

/** Execute Python in a secure, isolated sandbox kernel and return its output. */
async function runPython(code: string): Promise<string> {
  const ex = await (await kernel()).runCode(code);

  // Hand the agent everything it needs to self-correct.
  if (ex.error) {
    return `ERROR:\n${ex.error}\n\nstdout:\n${ex.stdout}`.trim();
  }
  const parts: string[] = [];
  if (ex.stdout) parts.push(ex.stdout.trimEnd());
  if (ex.stderr) parts.push(`[stderr]\n${ex.stderr.trimEnd()}`);
  if (ex.text && !(ex.stdout || "").includes(ex.text)) parts.push(`[result] ${ex.text}`);
  if (ex.png) parts.push("[chart] PNG produced (available as ex.png on the Execution)");
  return parts.join("\n\n") || "(no output)";
}

test("the recipe's run_python tool, in TypeScript", async (t) => {
  // Probe that the template exists (skips, or fails under CI, when not).
  const probe = await codeSandbox(t, { ttlSeconds: 60 });
  if (!probe) return;
  await killQuietly(probe);
  t.after(async () => {
    for (const sb of await Sandbox.list({ metadata: { tool: "smolagents-run-python" } })) await killQuietly(sb);
  });

  await t.test("state persists between two calls", async () => {
    assert.equal(await runPython("import numpy as np\nsamples = np.arange(10)"), "(no output)");
    assert.equal(await runPython("print(int(samples.sum()))"), "45");
    assert.equal(await runPython("float(samples.mean())"), "[result] 4.5");
  });

  await t.test("an exception returns ERROR: naming the exception", async () => {
    const out = await runPython("print('trying')\nundefined_name + 1");
    assert.match(out, /^ERROR:\n/);
    assert.match(out, /NameError/);
    assert.match(out, /undefined_name/);
    assert.match(out, /stdout:\ntrying$/);
  });

  await t.test("plt.show() returns the chart marker and ex.png decodes", async () => {
    const out = await runPython("import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()");
    assert.match(out, /\[chart\] PNG produced/);
    const ex = await (await kernel()).runCode("import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()");
    const chartB64 = ex.png;
    assertPng(chartB64);
  });

  await t.test("cleanup: ctx.close() tears the kernel down", async () => {
    const ctx = _ctx!;
    await ctx.close();
    await assert.rejects(ctx.runCode("1"), NotFoundError);
    _ctx = undefined;
  });
});
