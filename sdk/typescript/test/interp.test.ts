/**
 * Structured chart and table data, output kinds, background commands and
 * E2B's names, against the real server.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { CommandHandle, ConflictError, NotFoundError, type Result } from "@pandastack/sdk";
import { assertPng, codeSandbox, haveServer, newSandbox } from "./helpers.js";

function oneWith(results: Result[], key: "chart" | "data" | "png"): Result {
  const found = results.filter((r) => r[key] !== undefined);
  assert.equal(found.length, 1, JSON.stringify(results.map((r) => r.formats())));
  return found[0]!;
}

test("structured data and output kinds", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;

  await t.test("a scatter chart beside its PNG", async () => {
    const ex = await sb.runCode(
      "import matplotlib.pyplot as plt\nplt.scatter([1, 2], [5, 3], label='pts')\nplt.ylabel('y')\nplt.show()",
    );
    assert.equal(ex.error, undefined, String(ex.error));
    const r = oneWith(ex.results, "chart");
    assertPng(r.png);
    assert.deepEqual(r.formats(), ["text", "png", "chart"]);
    assert.equal(r.chart!.type, "scatter");
    assert.equal(r.chart!.y_label, "y");
    assert.deepEqual(r.chart!.elements, [{ label: "pts", points: [[1, 5], [2, 3]] }]);
  });

  await t.test("a pie chart", async () => {
    const ex = await sb.runCode("import matplotlib.pyplot as plt\nplt.pie([3, 1], labels=['big', 'small'])\nplt.show()");
    assert.deepEqual(oneWith(ex.results, "chart").chart!.elements, [
      { label: "big", angle: 270, radius: 1 },
      { label: "small", angle: 90, radius: 1 },
    ]);
  });

  await t.test("a DataFrame's data", async () => {
    const ex = await sb.runCode("import pandas as pd\npd.DataFrame({'n': [1, 2], 's': ['a', 'b']})");
    const d = oneWith(ex.results, "data").data!;
    assert.deepEqual([d.kind, d.columns, d.rows, d.total_rows], ["dataframe", ["n", "s"], [[1, "a"], [2, "b"]], 2]);
  });

  await t.test("a PIL image as PNG, and display formats", async () => {
    let ex = await sb.runCode("from PIL import Image\nImage.new('RGB', (30, 20), 'green')");
    assertPng(oneWith(ex.results, "png").png, 50);
    ex = await sb.runCode(
      "from IPython.display import display, SVG, Javascript\n" +
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')); display(Javascript('1+1'))",
    );
    assert.deepEqual(
      ex.results.map((r) => r.formats()),
      [
        ["text", "svg"],
        ["text", "javascript"],
      ],
    );
    assert.equal(ex.results[1]!.javascript, "1+1");
  });

  await t.test("Execution.logs", async () => {
    const ex = await sb.runCode("print('hi')");
    assert.deepEqual(ex.logs, { stdout: ["hi\n"], stderr: [] });
  });

  await t.test("Execution.mainResult", async () => {
    const ex = await sb.runCode("print('shown')\n6 * 7");
    assert.equal(ex.mainResult?.text, "42");
    assert.equal(ex.mainResult?.isMainResult, true);
    assert.equal((await sb.runCode("x = 1")).mainResult, undefined);
  });
});

test("background commands", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);

  await t.test("stream, feed stdin, wait", async () => {
    const h = await sb.exec("echo ready; read x; echo got $x", { background: true });
    assert.ok(h instanceof CommandHandle && h.pid > 0 && h.info.running);
    assert.deepEqual(
      (await sb.listProcesses()).map((p) => p.pid),
      [h.pid],
    );
    const chunks: string[] = [];
    for await (const c of h) {
      chunks.push(c.data);
      if (c.data.includes("ready")) break;
    }
    assert.deepEqual(await h.output(), { stdout: "ready\n", stderr: "" });
    await h.sendStdin("42\n");
    const res = await h.wait();
    assert.deepEqual([res.stdout, res.exitCode], ["ready\ngot 42\n", 0]);
    assert.equal(h.info.running, false);
    await assert.rejects(h.sendStdin("late"), ConflictError);
  });

  await t.test("kill, and E2B's names", async () => {
    const h = await sb.commands.run("sleep 600", { background: true });
    const again = await sb.commands.connect(h.pid);
    assert.equal(again.info.cmd, "sleep 600");
    await sb.commands.kill(h.pid);
    assert.equal((await h.wait()).signal, "SIGKILL");
    await assert.rejects(sb.connectProcess(999999), NotFoundError);
    const stray = await sb.commands.run("sleep 601", { background: true });
    await sb.exec("setsid sleep 602 </dev/null >/dev/null 2>&1 &"); // a daemon
    const killed = await sb.commands.killAll();
    assert.ok(killed.killed >= 2 && killed.remaining === 0, JSON.stringify(killed));
    assert.equal((await stray.wait()).signal, "SIGKILL");
    const res = await sb.commands.run("echo alias");
    assert.equal(res.stdout, "alias\n");
    const before = sb.expiresAt.getTime();
    await sb.setTimeout(3000);
    assert.ok(sb.expiresAt.getTime() > before);
  });
});

test("javascript, typescript and r", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;
  let ex = await sb.runCode("const s: string = await Promise.resolve('ts'); s.toUpperCase()", { language: "typescript" });
  assert.equal(ex.error, undefined, String(ex.error));
  assert.equal(ex.text, '"TS"');
  const ctx = await sb.createCodeContext({ language: "r" });
  ex = await ctx.runCode("x <- c(1, 2, 3); cat(sum(x), Sys.getenv('V'))", { env: { V: "env-ok" } });
  assert.equal(ex.stdout, "6 env-ok");
  await ctx.close();
});

test("java", async (t) => {
  const sb = await codeSandbox(t);
  if (!sb) return;
  const ctx = await sb.createCodeContext({ language: "java" });
  let ex = await ctx.runCode("var xs = java.util.List.of(1, 2, 3);\nSystem.out.println(System.getenv(\"V\"));", {
    env: { V: "env-ok" },
    timeout: 180,
  });
  assert.equal(ex.error, undefined, String(ex.error?.value));
  assert.equal(ex.stdout, "env-ok\n");
  ex = await ctx.runCode("xs.stream().mapToInt(Integer::intValue).sum() * 7");
  assert.equal(ex.text, "42");
  await ctx.close();
});
