/**
 * Snapshots, restore, fork and pause/resume. These endpoints are landing on
 * the server in parallel: while a route answers 404 the affected step skips
 * with a message on a developer machine and fails under CI=true.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { ConflictError, NotFoundError, Sandbox, Snapshot } from "@pandastack/sdk";
import { codeSandbox, killQuietly, needsEndpoint, startRun } from "./helpers.js";

const here = dirname(fileURLToPath(import.meta.url));

test("snapshots, fork, pause/resume", async (t) => {
  const sb = await codeSandbox(t, { ttlSeconds: 900 });
  if (!sb) return;
  const ctx = await sb.createCodeContext();
  await ctx.runCode("secret = 21\nimport json");
  await sb.runCode("default_var = 'kept'");
  await sb.files.write("state/note.txt", "written before the snapshot");

  await t.test("snapshot, then create from it in another process: variables and files are back", async (t) => {
    const snapshotId = await needsEndpoint(t, "POST /v1/sandboxes/{id}/snapshots", () =>
      sb.snapshot({ metadata: { suite: "ts-sdk" } }),
    );
    if (!snapshotId) return;
    assert.match(snapshotId, /^snap_/);
    // The parent keeps running, with its state.
    assert.equal((await ctx.runCode("secret")).text, "21");

    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [join(here, "restore-child.js"), snapshotId, ctx.id],
      { env: process.env, timeout: 300_000 },
    ).catch((err: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`restore child failed: ${err.message}\nstdout: ${err.stdout}\nstderr: ${err.stderr}`);
    });
    const got = JSON.parse(stdout.trim().split("\n").pop()!) as Record<string, string>;
    assert.equal(got.inContext, "42", stderr);
    assert.equal(got.inDefault, "'kept'");
    assert.equal(got.file, "written before the snapshot");
    assert.equal(got.template, "code-interpreter");
    assert.notEqual(got.id, sb.id);
    await assert.rejects(Sandbox.connect(got.id!), NotFoundError);

    const info = await needsEndpoint(t, "GET /v1/snapshots/{id}", () => Snapshot.get(snapshotId));
    if (info) {
      assert.equal(info.id, snapshotId);
      assert.equal(info.sandboxId, sb.id);
      assert.ok(info.sizeBytes > 0);
      assert.deepEqual(info.network, sb.network); // the policy its restores get
      await Snapshot.delete(snapshotId);
      await assert.rejects(Snapshot.get(snapshotId), NotFoundError);
    }
  });

  await t.test("fork makes independent copies", async (t) => {
    const kids = await needsEndpoint(t, "POST /v1/sandboxes/{id}/fork", () => sb.fork(2));
    if (!kids) return;
    t.after(async () => {
      for (const k of kids) await killQuietly(k);
    });
    assert.equal(kids.length, 2);
    assert.equal(new Set([sb.id, ...kids.map((k) => k.id)]).size, 3);
    for (const [i, k] of kids.entries()) {
      assert.equal(k.state, "running");
      const ex = await k.runCode(`secret += ${i + 1}\nsecret`, { context: ctx.id });
      assert.equal(ex.text, String(21 + i + 1));
    }
    assert.equal((await kids[0]!.runCode("secret", { context: ctx.id })).text, "22");
    assert.equal((await kids[1]!.runCode("secret", { context: ctx.id })).text, "23");
    assert.equal((await ctx.runCode("secret")).text, "21");
  });

  await t.test("a snapshot while code runs is a ConflictError: snapshots never wait", async (t) => {
    const running = (await startRun(ctx, "import time\ntime.sleep(30)")).done;
    try {
      await needsEndpoint(t, "POST /v1/sandboxes/{id}/snapshots", () =>
        assert.rejects(sb.snapshot(), (err: unknown) => {
          assert.ok(err instanceof ConflictError, String(err));
          return true;
        }),
      );
    } finally {
      await ctx.interrupt();
      assert.equal((await running).error?.name, "KeyboardInterrupt");
    }
  });

  await t.test("Snapshot.list filters by metadata", async (t) => {
    const tag = `list-${Date.now()}`;
    const id = await needsEndpoint(t, "POST /v1/sandboxes/{id}/snapshots", () => sb.snapshot({ metadata: { tag } }));
    if (!id) return;
    const found = await Snapshot.list({ metadata: { tag } });
    assert.deepEqual(
      found.map((s) => s.id),
      [id],
    );
    assert.deepEqual(found[0]!.metadata, { tag });
    assert.equal(found[0]!.template, "code-interpreter");
    assert.ok(found[0]!.createdAt instanceof Date);
    await Snapshot.delete(id);
    assert.deepEqual(await Snapshot.list({ metadata: { tag } }), []);
  });

  await t.test("pause and resume keep the kernel's state", async (t) => {
    const paused = await needsEndpoint(t, "POST /v1/sandboxes/{id}/pause", () => sb.pause().then(() => true));
    if (!paused) return;
    assert.equal(sb.state, "paused");
    await assert.rejects(ctx.runCode("secret"), ConflictError);
    // A fork of the paused sandbox starts from its paused image; the
    // sandbox stays paused.
    const [kid] = await sb.fork(1, { ttlSeconds: 60 });
    try {
      assert.equal((await kid!.runCode("secret", { context: ctx.id })).text, "21");
    } finally {
      await kid!.kill();
    }
    assert.equal((await sb.getInfo()).state, "paused");
    await sb.resume();
    assert.equal(sb.state, "running");
    assert.equal((await ctx.runCode("secret")).text, "21");
  });

  await t.test("autoResume: a request to a paused sandbox resumes it", async (t) => {
    const auto = await codeSandbox(t, { autoResume: true });
    if (!auto) return;
    assert.equal(auto.autoResume, true);
    await auto.runCode("kept = 'across pause'");
    const paused = await needsEndpoint(t, "POST /v1/sandboxes/{id}/pause", () => auto.pause().then(() => true));
    if (!paused) return;
    assert.equal(auto.state, "paused");
    assert.equal((await auto.runCode("kept")).text, "'across pause'");
    const info = await auto.getInfo();
    assert.equal(info.state, "running");
    assert.equal(info.autoResume, true);
  });
});
