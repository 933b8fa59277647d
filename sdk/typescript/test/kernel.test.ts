/**
 * What happens to a kernel that dies, and what a context refuses (issue 14),
 * against a real server.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { ConflictError, InvalidRequestError, NotFoundError, Sandbox } from "@pandastack/sdk";
import { codeSandbox } from "./helpers.js";

test("kernel lifecycle", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;

  await t.test("a dead kernel restarts on the next run, which says so", async () => {
    const ctx = await sb.createCodeContext();
    assert.equal(ctx.autoRestart, true);
    await ctx.runCode("lost = 1");
    const died = await ctx.runCode("import os\nos._exit(1)");
    assert.equal(died.error?.name, "KernelDied");
    const restarted = await ctx.runCode("lost");
    assert.equal(restarted.error?.name, "KernelRestarted");
    assert.match(restarted.error?.value ?? "", /not run/);
    assert.equal((await ctx.runCode("lost")).error?.name, "NameError");
    assert.equal((await ctx.runCode("6 * 7")).text, "42");
    await ctx.close();
  });

  await t.test("autoRestart false keeps the dead kernel dead until restart()", async () => {
    const ctx = await sb.createCodeContext({ autoRestart: false });
    assert.equal(ctx.autoRestart, false);
    assert.equal((await ctx.runCode("import os\nos._exit(1)")).error?.name, "KernelDied");
    await assert.rejects(ctx.runCode("1"), ConflictError);
    await ctx.restart();
    assert.equal((await ctx.runCode("1 + 1")).text, "2");
    await ctx.close();
  });

  await t.test("a language other than the context's is refused", async () => {
    const ctx = await sb.createCodeContext();
    await assert.rejects(sb.runCode("console.log(1)", { language: "javascript", context: ctx }), InvalidRequestError);
    assert.equal((await sb.runCode("1 + 2", { language: "python", context: ctx })).text, "3");
    await ctx.close();
  });

  await t.test("a cwd the user cannot enter is refused", async () => {
    await assert.rejects(sb.createCodeContext({ cwd: "/root" }), (e: unknown) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.match((e as Error).message, /permission denied/);
      return true;
    });
  });
});

test("a fresh sandbox and a kill during a run", async (t) => {
  await t.test("the first cell of a fresh sandbox has execution count 1", async (tt) => {
    const sb = await codeSandbox(tt);
    if (!sb) return;
    const ex = await sb.runCode("6 * 7");
    assert.equal(ex.text, "42");
    assert.equal(ex.executionCount, 1);
  });

  await t.test("a run cut off by a kill says killed, and the sandbox is stopped", async (tt) => {
    const sb = await codeSandbox(tt);
    if (!sb) return;
    let started!: () => void;
    const go = new Promise<void>((resolve) => (started = resolve));
    const run = sb.runCode("print('go', flush=True)\nimport time\ntime.sleep(120)", { onStdout: () => started(), timeout: 300 });
    run.catch(() => started());
    await go;
    await (await Sandbox.connect(sb.id)).kill();
    await assert.rejects(run, (e: unknown) => {
      assert.match(String((e as Error).message), /killed/);
      return true;
    });
    try {
      const info = await sb.getInfo();
      assert.equal(info.state, "stopped");
      assert.equal(info.stopReason, "killed");
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  });
});
