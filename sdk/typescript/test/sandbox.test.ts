/**
 * Sandboxes, exec, files and errors against the real server, with the base
 * template (the cheapest to boot).
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { getEventListeners } from "node:events";
import { createServer } from "node:net";
import { test } from "node:test";
import {
  APIConnectionError,
  AuthenticationError,
  CommandNotFoundError,
  ConflictError,
  InsufficientStorageError,
  InsufficientMemoryError,
  InternalServerError,
  InvalidRequestError,
  MethodNotAllowedError,
  NotFoundError,
  PandaStackError,
  PayloadTooLargeError,
  PermissionDeniedError,
  PortUnreachableError,
  Sandbox,
  SandboxStoppedError,
  SnapshotCorruptError,
  TemplateNotBuiltError,
  TimeoutError,
  type FileEvent,
  type SandboxState,
} from "@pandastack/sdk";
import { haveServer, newSandbox } from "./helpers.js";

/** Runs fn with an environment variable unset, restoring it afterwards. */
async function withoutEnv<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const saved = process.env[name];
  delete process.env[name];
  try {
    return await fn();
  } finally {
    if (saved !== undefined) process.env[name] = saved;
  }
}

test("a missing API key is a clear error naming PANDASTACK_API_KEY", async () => {
  await withoutEnv("PANDASTACK_API_KEY", async () => {
    for (const call of [() => Sandbox.create(), () => Sandbox.connect("sbx_x"), () => Sandbox.list()]) {
      await assert.rejects(call, (err: unknown) => {
        assert.ok(err instanceof AuthenticationError, `got ${String(err)}`);
        assert.ok(err instanceof PandaStackError);
        assert.equal(err.code, "missing_api_key");
        assert.equal(err.status, undefined);
        assert.match(err.message, /PANDASTACK_API_KEY/);
        return true;
      });
    }
  });
});

test("each server error code has its own class, as in the Python SDK", async () => {
  // A local server that answers every request with the error code asked for.
  const http = await import("node:http");
  const statuses: Record<string, number> = {
    template_not_built: 409, command_not_found: 400, method_not_allowed: 405, payload_too_large: 413,
    snapshot_corrupt: 422, port_unreachable: 502, insufficient_storage: 507, insufficient_memory: 503, internal: 500,
  };
  const srv = http.createServer((req, res) => {
    const code = new URL(req.url ?? "/", "http://x").searchParams.get("metadata.code") ?? "internal";
    res.writeHead(statuses[code] ?? 500, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ error: { code, message: "from the test" } }));
  });
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  try {
    const apiUrl = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    const want: Record<string, Function> = {
      template_not_built: TemplateNotBuiltError, command_not_found: CommandNotFoundError,
      method_not_allowed: MethodNotAllowedError, payload_too_large: PayloadTooLargeError,
      snapshot_corrupt: SnapshotCorruptError, port_unreachable: PortUnreachableError,
      insufficient_storage: InsufficientStorageError, insufficient_memory: InsufficientMemoryError,
      internal: InternalServerError,
    };
    for (const [code, cls] of Object.entries(want)) {
      await assert.rejects(Sandbox.list({ apiKey: "pds_x", apiUrl, metadata: { code } }), (err: unknown) => {
        assert.ok(err instanceof cls && err instanceof PandaStackError, `${code}: got ${String(err)}`);
        assert.equal((err as PandaStackError).code, code);
        return true;
      });
    }
  } finally {
    srv.close();
  }
});

test("list asks a server from before pages once without them, and refuses a list that would never end", async () => {
  const http = await import("node:http");
  const queries: string[] = [];
  const srv = http.createServer((req, res) => {
    const q = new URL(req.url ?? "/", "http://x").searchParams;
    queries.push(q.toString());
    res.setHeader("Content-Type", "application/json");
    if (q.get("metadata.server") === "old" && q.has("limit")) {
      res.writeHead(400);
      res.end(JSON.stringify({ error: { code: "invalid_request", message: 'unknown query parameter "limit"; filter with metadata.<key>=<value> or state=' } }));
    } else if (q.get("metadata.server") === "old") {
      res.end(JSON.stringify({ sandboxes: [{ id: "sbx_a" }, { id: "sbx_b" }] }));
    } else {
      res.end(JSON.stringify({ sandboxes: [{ id: "sbx_a" }], next: "same" }));
    }
  });
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  try {
    const apiUrl = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    const old = await Sandbox.list({ apiKey: "pds_x", apiUrl, metadata: { server: "old" } });
    assert.deepEqual(old.map((s) => s.id), ["sbx_a", "sbx_b"]);
    assert.deepEqual(queries, ["limit=500&metadata.server=old", "metadata.server=old"]);
    await assert.rejects(Sandbox.list({ apiKey: "pds_x", apiUrl, metadata: { server: "stuck" } }), /never end/);
  } finally {
    srv.close();
  }
});

test("connectProcess of an unknown pid: a NotFoundError worded as the server's own", async () => {
  // The SDK finds the pid missing in the list itself (a server of the
  // test's own, that runs none); its message ends as every other does.
  const http = await import("node:http");
  const srv = http.createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "application/json" });
    const processes = req.url?.endsWith("/processes");
    res.end(JSON.stringify(processes ? { processes: [] } : { id: "sbx_fake", template: "base", state: "running", metadata: {} }));
  });
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  try {
    const apiUrl = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    const sb = await Sandbox.connect("sbx_fake", { apiKey: "pds_x", apiUrl });
    await assert.rejects(sb.connectProcess(42), (err: unknown) => {
      assert.ok(err instanceof NotFoundError, String(err));
      assert.deepEqual([err.code, err.status], ["not_found", 404]);
      assert.equal(err.message, "no background process 42 in sandbox sbx_fake (not_found, HTTP 404)");
      return true;
    });
  } finally {
    srv.close();
  }
});

test("a run whose error comes only in its final event still calls onError", async () => {
  // As when the sandbox stops under a streamed run: no error event, the
  // final execution carries it (a server of the test's own).
  const http = await import("node:http");
  const srv = http.createServer((req, res) => {
    if (req.method === "GET") {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ id: "sbx_fake", template: "code-interpreter", state: "running", metadata: {} }));
      return;
    }
    res.writeHead(200, { "Content-Type": "application/x-ndjson" });
    res.write(JSON.stringify({ type: "stdout", data: "partial\n" }) + "\n");
    res.end(JSON.stringify({ type: "execution", execution: { stdout: "partial\n", results: [],
      error: { name: "SandboxError", value: "the sandbox stopped", traceback: "" } } }) + "\n");
  });
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  try {
    const apiUrl = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    const sb = await Sandbox.connect("sbx_fake", { apiKey: "pds_x", apiUrl });
    const errors: string[] = [];
    const out: string[] = [];
    const ex = await sb.runCode("x", { onStdout: (s) => void out.push(s), onError: (e) => void errors.push(e.name) });
    assert.equal(ex.error?.name, "SandboxError");
    assert.deepEqual(out, ["partial\n"]);
    assert.deepEqual(errors, ["SandboxError"], "onError once, for the error of the final event");
  } finally {
    srv.close();
  }
});

test("timeoutMs bounds the wait for an answer (client_timeout), not an exec's", async () => {
  // A server that never answers a list, answers a sandbox at once, and an
  // exec only after its command's 600 ms.
  const http = await import("node:http");
  const srv = http.createServer((req, res) => {
    if (req.url?.startsWith("/v1/sandboxes/sbx_t/exec")) {
      setTimeout(() => {
        res.writeHead(200, { "Content-Type": "application/x-ndjson" });
        res.end(JSON.stringify({ type: "exit", exit_code: 0, duration_ms: 600 }) + "\n");
      }, 600);
    } else if (req.url === "/v1/sandboxes/sbx_t") {
      res.writeHead(200, { "Content-Type": "application/json" });
      const now = new Date().toISOString();
      res.end(JSON.stringify({ id: "sbx_t", template: "base", state: "running", cpu: 1, memory_mb: 512, created_at: now, expires_at: now }));
    }
  });
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  try {
    const apiUrl = `http://127.0.0.1:${(srv.address() as { port: number }).port}`;
    const start = Date.now();
    await assert.rejects(Sandbox.list({ apiKey: "pds_x", apiUrl, timeoutMs: 300 }), (err: unknown) => {
      assert.ok(err instanceof TimeoutError, `got ${String(err)}`);
      assert.equal(err.code, "client_timeout");
      return true;
    });
    const took = Date.now() - start;
    assert.ok(took >= 250 && took < 10_000, `took ${took} ms`);
    const sb = await Sandbox.connect("sbx_t", { apiKey: "pds_x", apiUrl, timeoutMs: 300 });
    assert.equal((await sb.exec("sleep 0.6")).exitCode, 0);
    await assert.rejects(Sandbox.list({ apiKey: "pds_x", apiUrl, timeoutMs: 0 }), TypeError);
  } finally {
    srv.closeAllConnections();
    srv.close();
  }
});

test("an unreachable server is a connection_error naming the URL", async () => {
  // A port that was free a moment ago: nothing listens there.
  const port = await new Promise<number>((ok) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => ok(p));
    });
  });
  const apiUrl = `http://127.0.0.1:${port}`;
  await assert.rejects(Sandbox.list({ apiKey: "pds_whatever", apiUrl }), (err: unknown) => {
    assert.ok(err instanceof APIConnectionError, `got ${String(err)}`);
    assert.equal(err.code, "connection_error");
    assert.ok(err.message.includes(apiUrl), err.message);
    return true;
  });
  // host:port without a scheme is taken as http, as the Python SDK does
  // (it was an "Invalid URL" reported as the server being unreachable).
  await assert.rejects(Sandbox.list({ apiKey: "pds_whatever", apiUrl: `127.0.0.1:${port}` }), (err: unknown) => {
    assert.ok(err instanceof PandaStackError && err.message.includes(apiUrl), `got ${String(err)}`);
    assert.ok(!err.message.includes("Invalid URL"), err.message);
    return true;
  });
});

test("sandbox lifecycle", async (t) => {
  if (!haveServer(t)) return;
  const tag = `life-${process.pid}-${Date.now()}`;
  const sb = await newSandbox(t, { ttlSeconds: 120, metadata: { tag }, env: { GREETING: "hi from env" } });

  await t.test("create returns a running sandbox with camelCase fields", () => {
    assert.match(sb.id, /^sbx_[a-z2-7]{16}$/);
    assert.equal(sb.state, "running");
    assert.equal(sb.template, "base");
    assert.deepEqual(sb.metadata, { suite: "ts-sdk", tag });
    assert.ok(sb.cpu >= 1);
    assert.ok(sb.memoryMb >= 64);
    assert.ok(sb.createdAt instanceof Date && !Number.isNaN(sb.createdAt.getTime()));
    const ttl = (sb.expiresAt.getTime() - sb.createdAt.getTime()) / 1000;
    assert.ok(ttl > 100 && ttl <= 121, `ttl ${ttl}`);
  });

  await t.test("listTemplates has the template it was made from", async () => {
    const base = (await Sandbox.listTemplates()).find((tpl) => tpl.name === "base");
    assert.ok(base, "base listed");
    assert.ok(base.sizeBytes > 0 && base.cpu >= 1 && base.memoryMb >= 64 && base.hash !== "", JSON.stringify(base));
    assert.ok(base.builtAt instanceof Date && !Number.isNaN(base.builtAt.getTime()));
  });

  await t.test("stats: memory, CPU time and disk within the limits", async () => {
    await sb.exec("python3 -c 'sum(range(3_000_000))'");
    const st = await sb.stats();
    assert.equal(st.memoryLimitBytes, sb.memoryMb * 2 ** 20);
    assert.equal(st.cpuLimit, sb.cpu);
    assert.ok(st.memoryBytes > 0 && st.memoryBytes < st.memoryLimitBytes, `memory ${st.memoryBytes}`);
    assert.ok(st.cpuSeconds > 0, `cpu ${st.cpuSeconds}`);
    assert.ok(st.sampledAt instanceof Date && !Number.isNaN(st.sampledAt.getTime()));
    // Its disk, as df shows it inside: a file written shows in its use.
    assert.ok(st.diskLimitBytes !== undefined && st.diskBytes !== undefined, JSON.stringify(st));
    assert.ok(st.diskBytes > 0 && st.diskBytes < st.diskLimitBytes, JSON.stringify(st));
    await sb.exec("head -c 20000000 /dev/urandom > /home/user/disk-fill");
    try {
      const after = await sb.stats();
      assert.equal(after.diskLimitBytes, st.diskLimitBytes);
      assert.ok(after.diskBytes !== undefined && after.diskBytes >= st.diskBytes + 19_000_000, JSON.stringify(after));
    } finally {
      await sb.exec("rm -f /home/user/disk-fill");
    }
  });

  await t.test("env given at create reaches commands", async () => {
    const r = await sb.exec("echo $GREETING");
    assert.equal(r.stdout, "hi from env\n");
  });

  await t.test("connect finds it by id", async () => {
    const again = await Sandbox.connect(sb.id);
    assert.equal(again.id, sb.id);
    assert.equal(again.state, "running");
    assert.equal((await again.exec("echo same")).stdout, "same\n");
  });

  await t.test("list filters by metadata", async () => {
    const found = await Sandbox.list({ metadata: { tag } });
    assert.deepEqual(
      found.map((s) => s.id),
      [sb.id],
    );
    assert.deepEqual(await Sandbox.list({ metadata: { tag: "no-such-tag" } }), []);
  });

  await t.test("setTtl moves expiresAt", async () => {
    const before = sb.expiresAt.getTime();
    await sb.setTtl(1800);
    const left = (sb.expiresAt.getTime() - Date.now()) / 1000;
    assert.ok(left > 1700 && left <= 1800, `expires in ${left}s`);
    assert.ok(sb.expiresAt.getTime() > before);
    const info = await sb.getInfo();
    assert.equal(info.expiresAt.getTime(), sb.expiresAt.getTime());
  });

  await t.test("idleTimeoutSeconds: the server's default, then set with PATCH", async () => {
    assert.equal(sb.idleTimeoutSeconds, 300);
    assert.equal(sb.pauseReason, undefined);
    await sb.setIdleTimeout(0);
    assert.equal(sb.idleTimeoutSeconds, 0);
    assert.equal((await sb.getInfo()).idleTimeoutSeconds, 0);
    const other = await Sandbox.create({ idleTimeoutSeconds: 45 });
    try {
      assert.equal(other.idleTimeoutSeconds, 45);
    } finally {
      await other.kill();
    }
  });

  await t.test(
    "list filters by state",
    async () => {
      const ids = async (state: SandboxState[] | "all") =>
        (await Sandbox.list({ metadata: { tag }, state })).map((s) => s.id);
      assert.deepEqual(await ids(["running"]), [sb.id]);
      assert.deepEqual(await ids("all"), [sb.id]);
      assert.deepEqual(await ids(["stopped"]), [], "state=stopped listed a running sandbox");
    },
  );

  await t.test("list reads every page", async () => {
    const more = [await Sandbox.create({ metadata: { tag }, ttlSeconds: 120 }), await Sandbox.create({ metadata: { tag }, ttlSeconds: 120 })];
    try {
      const want = [sb.id, ...more.map((s) => s.id)];
      assert.deepEqual((await Sandbox.list({ metadata: { tag }, pageSize: 2 })).map((s) => s.id), want);
      assert.deepEqual((await Sandbox.list({ metadata: { tag }, state: "all", pageSize: 1 })).map((s) => s.id), want);
    } finally {
      for (const s of more) await s.kill();
    }
    await assert.rejects(Sandbox.list({ metadata: { tag }, pageSize: 0 }), InvalidRequestError);
  });

  await t.test("kill deletes it", async () => {
    await sb.kill();
    await assert.rejects(Sandbox.connect(sb.id), NotFoundError);
    await assert.rejects(sb.exec("true"), NotFoundError);
    assert.deepEqual(await Sandbox.list({ metadata: { tag } }), []);
  });

  await t.test("killing it again is not an error (cleanup code may)", async () => {
    await sb.kill();
    assert.equal(sb.state, "stopped");
  });
});

test("exec", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);

  await t.test("a shell string", async () => {
    const r = await sb.exec("echo out; echo err >&2; exit 3");
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(r.exitCode, 3);
    assert.equal(r.timedOut, false);
    assert.equal(typeof r.durationMs, "number");
  });

  await t.test("an argv array runs without a shell", async () => {
    const r = await sb.exec(["printf", "%s|", "a b", "$HOME", "c"]);
    assert.equal(r.stdout, "a b|$HOME|c|");
    assert.equal(r.exitCode, 0);
  });

  await t.test("runs as user in /home/user; env, cwd and stdin apply", async () => {
    assert.equal((await sb.exec("id -un; pwd")).stdout, "user\n/home/user\n");
    const r = await sb.exec("echo $A-$B; pwd; cat", { env: { A: "1", B: "two" }, cwd: "/tmp", stdin: "piped\n" });
    assert.equal(r.stdout, "1-two\n/tmp\npiped\n");
  });

  await t.test("a timeout kills the command and says so", async () => {
    const r = await sb.exec("echo started; sleep 30", { timeout: 1 });
    assert.equal(r.timedOut, true);
    assert.equal(r.stdout, "started\n");
    assert.ok(r.durationMs < 10_000, `took ${r.durationMs} ms`);
  });

  await t.test("streaming callbacks arrive in order, as output happens", async () => {
    const events: string[] = [];
    const seenAt: number[] = [];
    const start = Date.now();
    const r = await sb.exec("for i in 1 2 3; do echo out$i; sleep 0.2; echo err$i >&2; sleep 0.2; done; echo done", {
      onStdout: (d) => {
        events.push(`out:${d}`);
        seenAt.push(Date.now() - start);
      },
      onStderr: (d) => {
        events.push(`err:${d}`);
      },
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "out1\nout2\nout3\ndone\n");
    assert.equal(r.stderr, "err1\nerr2\nerr3\n");
    // The order the command wrote in (200 ms apart), across both streams.
    assert.deepEqual(
      events.map((e) => e.trim()),
      ["out:out1", "err:err1", "out:out2", "err:err2", "out:out3", "err:err3", "out:done"],
    );
    // The first chunk arrived well before the command ended: it streamed.
    const total = Date.now() - start;
    assert.ok(seenAt[0]! < total - 700, `first chunk at ${seenAt[0]} ms of ${total} ms`);
  });

  await t.test("async callbacks are awaited one at a time", async () => {
    const seen: string[] = [];
    let busy = false;
    await sb.exec("for i in 1 2 3 4 5; do echo $i; done", {
      onStdout: async (d) => {
        assert.equal(busy, false, "a callback started before the previous one finished");
        busy = true;
        await new Promise((r) => setTimeout(r, 20));
        seen.push(d);
        busy = false;
      },
    });
    assert.equal(seen.join(""), "1\n2\n3\n4\n5\n");
  });

  await t.test("a streamed command's large output arrives whole (binary stream)", async () => {
    const made = await sb.exec("head -c 12582912 /dev/urandom | base64 -w 100 > blob && sha256sum blob", { timeout: 120 });
    const want = made.stdout.split(" ")[0];
    const h = createHash("sha256");
    const r = await sb.exec("cat blob; exit 5", { timeout: 300, onStdout: (d) => void h.update(d) });
    assert.equal(r.exitCode, 5);
    assert.equal(h.digest("hex"), want);
    assert.equal(createHash("sha256").update(r.stdout).digest("hex"), want);
  });

  await t.test("a streamed command's timeout and exit code come back", async () => {
    const r = await sb.exec("echo a; sleep 10", { timeout: 0.5, onStdout: () => {} });
    assert.equal(r.timedOut, true);
    assert.equal(r.stdout, "a\n");
    const r2 = await sb.exec("exit 7", { onStdout: () => {} });
    assert.equal(r2.exitCode, 7);
  });

  await t.test("a sandbox killed mid-stream throws SandboxStoppedError", async () => {
    const doomed = await newSandbox(t);
    const chunks: string[] = [];
    let started!: () => void;
    const first = new Promise<void>((r) => (started = r));
    const run = doomed.exec("echo first; sleep 20; echo never", {
      onStdout: (d) => {
        chunks.push(d);
        started();
      },
    });
    await Promise.race([first, run]); // also observes run, so its rejection is handled
    await doomed.kill();
    await assert.rejects(run, (err: unknown) => {
      assert.ok(err instanceof SandboxStoppedError, String(err));
      assert.equal(err.code, "sandbox_stopped");
      assert.match(err.message, new RegExp(doomed.id));
      return true;
    });
    assert.deepEqual(chunks, ["first\n"]);
  });

  await t.test("aborting the signal rejects with AbortError and kills the command", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    await assert.rejects(sb.exec("sleep 2; touch /tmp/should-not-exist", { signal: ac.signal }), { name: "AbortError" });
    await new Promise((r) => setTimeout(r, 2500));
    assert.equal(await sb.files.exists("/tmp/should-not-exist"), false, "the command outlived its request");
  });

  await t.test("a missing program is an InvalidRequestError with code command_not_found", async () => {
    await assert.rejects(sb.exec(["no-such-program-xyz"]), (err: unknown) => {
      assert.ok(err instanceof InvalidRequestError && err instanceof CommandNotFoundError, String(err));
      assert.equal(err.code, "command_not_found");
      assert.equal(err.status, 400);
      return true;
    });
  });
});

test("files", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);

  await t.test("write text, read it back as bytes and text", async () => {
    const text = "héllo, wörld ✓\nline 2\n";
    const info = await sb.files.write("notes/hello.txt", text);
    assert.equal(info.path, "/home/user/notes/hello.txt");
    assert.equal(info.name, "hello.txt");
    assert.equal(info.type, "file");
    assert.equal(info.size, Buffer.byteLength(text));
    assert.equal(info.mode, "0644");
    assert.ok(info.modTime instanceof Date);
    assert.equal(await sb.files.readText("/home/user/notes/hello.txt"), text);
    assert.deepEqual(Buffer.from(await sb.files.read("notes/hello.txt")), Buffer.from(text));
    // And the sandbox sees the same file.
    assert.equal((await sb.exec("cat notes/hello.txt")).stdout, text);
  });

  await t.test("binary data round-trips exactly", async () => {
    const data = new Uint8Array(300_000);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 8)) & 0xff;
    await sb.files.write("/tmp/blob.bin", data);
    const back = await sb.files.read("/tmp/blob.bin");
    assert.equal(back.length, data.length);
    assert.deepEqual(Buffer.from(back), Buffer.from(data));
    const sum = (await sb.exec("sha256sum /tmp/blob.bin | cut -d' ' -f1")).stdout.trim();
    const { createHash } = await import("node:crypto");
    assert.equal(sum, createHash("sha256").update(data).digest("hex"));
  });

  await t.test("data of another type is a TypeError, and nothing is written", async () => {
    for (const bad of [123, { a: 1 }, null]) {
      await assert.rejects(sb.files.write("/tmp/bad.txt", bad as unknown as string), TypeError);
    }
    assert.equal(await sb.files.exists("/tmp/bad.txt"), false);
  });

  await t.test("mkdir, list, stat, exists", async () => {
    const dir = await sb.files.mkdir("work/a/b");
    assert.equal(dir.type, "dir");
    assert.equal(dir.path, "/home/user/work/a/b");
    await sb.files.write("work/z.txt", "z");
    await sb.files.write("work/m.txt", "mm");
    const names = (await sb.files.list("work")).map((f) => `${f.name}:${f.type}`);
    assert.deepEqual(names, ["a:dir", "m.txt:file", "z.txt:file"]);
    const st = await sb.files.stat("work/m.txt");
    assert.equal(st.size, 2);
    assert.equal(await sb.files.exists("work/m.txt"), true);
    assert.equal(await sb.files.exists("work/nope.txt"), false);
    assert.ok((await sb.files.list()).some((f) => f.name === "work"), "home directory listing");
  });

  await t.test("rename moves, and an existing destination needs overwrite", async () => {
    const moved = await sb.files.rename("work/m.txt", "work/a/b/m2.txt");
    assert.equal(moved.path, "/home/user/work/a/b/m2.txt");
    assert.equal(moved.size, 2);
    assert.equal(await sb.files.exists("work/m.txt"), false);
    await assert.rejects(sb.files.rename("work/z.txt", "work/a/b/m2.txt"), (err: unknown) => {
      assert.ok(err instanceof ConflictError, String(err));
      return true;
    });
    assert.equal((await sb.files.rename("work/z.txt", "work/a/b/m2.txt", { overwrite: true })).size, 1);
    await sb.files.write("work/z.txt", "z");
  });

  await t.test("remove a file; a non-empty directory needs recursive", async () => {
    await sb.files.remove("work/z.txt");
    assert.equal(await sb.files.exists("work/z.txt"), false);
    await assert.rejects(sb.files.remove("work"), (err: unknown) => {
      assert.ok(err instanceof ConflictError, String(err));
      assert.equal(err.status, 409);
      return true;
    });
    await sb.files.remove("work", { recursive: true });
    assert.equal(await sb.files.exists("work"), false);
  });

  await t.test("root's files are refused with permission_denied", async () => {
    await assert.rejects(sb.files.read("/etc/shadow"), (err: unknown) => {
      assert.ok(err instanceof PermissionDeniedError, String(err));
      assert.equal(err.code, "permission_denied");
      assert.equal(err.status, 403);
      return true;
    });
    await assert.rejects(sb.files.write("/etc/pandastack-probe.txt", "x"), PermissionDeniedError);
    assert.equal(await sb.files.exists("/etc/pandastack-probe.txt"), false);
  });

  await t.test("a disk of its own size", async () => {
    const small = await Sandbox.create({ ttlSeconds: 120, diskMb: 128 });
    try {
      const r = await small.exec("df -m / | tail -1 | tr -s ' ' | cut -d' ' -f2");
      assert.equal(r.stdout.trim(), "128");
    } finally {
      await small.kill();
    }
  });

  await t.test("exists of a sandbox that is gone throws NotFoundError", async () => {
    const gone = await Sandbox.create({ ttlSeconds: 120 });
    await gone.files.write("f.txt", "x");
    assert.equal(await gone.files.exists("f.txt"), true);
    await gone.kill();
    await assert.rejects(gone.files.exists("f.txt"), NotFoundError);
  });

  await t.test("watchDir reports what commands do, until stop; a missing directory rejects", async () => {
    await sb.files.mkdir("watched");
    const seen: FileEvent[] = [];
    let exited: Error | undefined | null = null;
    const w = await sb.files.watchDir("watched", (ev) => seen.push(ev), { recursive: true, onExit: (err) => (exited = err) });
    await sb.exec("cd watched && echo one > a.txt && mkdir -p sub && echo two > sub/b.txt && rm a.txt");
    const want = ["create a.txt", "write a.txt", "create sub", "create sub/b.txt", "remove a.txt"];
    for (let i = 0; i < 400 && !want.every((k) => seen.some((ev) => `${ev.type} ${ev.name}` === k)); i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.deepEqual(want.filter((k) => !seen.some((ev) => `${ev.type} ${ev.name}` === k)), [], JSON.stringify(seen));
    const sub = seen.find((ev) => ev.name === "sub");
    assert.ok(sub?.isDir && sub.path === "/home/user/watched/sub", JSON.stringify(sub));
    await w.stop();
    assert.equal(exited, undefined, "onExit after stop() has no error");
    await w.wait();
    // A throwing async handler ends the watch, told by wait() (not an unhandled rejection).
    const failing = await sb.files.watchDir("watched", async () => {
      throw new Error("handler failed");
    });
    await sb.exec("touch watched/z");
    await assert.rejects(failing.wait(), /handler failed/);
    await assert.rejects(sb.files.watchDir("no-such-dir", () => {}), NotFoundError);
    await assert.rejects(sb.files.watchDir("notes/hello.txt", () => {}), InvalidRequestError);
    // One long-lived signal for many watches: a watch that ended without
    // it (stop(), a failure to start) holds no listener on it.
    const app = new AbortController();
    for (let i = 0; i < 3; i++) {
      const each = await sb.files.watchDir("watched", () => {}, { signal: app.signal });
      await each.stop();
    }
    await assert.rejects(sb.files.watchDir("no-such-dir", () => {}, { signal: app.signal }), NotFoundError);
    assert.equal(getEventListeners(app.signal, "abort").length, 0);
  });

  await t.test("a missing file is a NotFoundError", async () => {
    await assert.rejects(sb.files.read("/no/such/file"), (err: unknown) => {
      assert.ok(err instanceof NotFoundError, String(err));
      assert.equal(err.code, "not_found");
      assert.equal(err.status, 404);
      return true;
    });
    await assert.rejects(sb.files.stat("nope"), NotFoundError);
  });
});

test("typed errors carry the server's code and status", async (t) => {
  if (!haveServer(t)) return;

  await t.test("unknown sandbox: NotFoundError", async () => {
    await assert.rejects(Sandbox.connect("sbx_aaaaaaaaaaaaaaaa"), (err: unknown) => {
      assert.ok(err instanceof NotFoundError, String(err));
      assert.equal(err.code, "not_found");
      assert.equal(err.status, 404);
      assert.match(err.message, /sbx_aaaaaaaaaaaaaaaa/);
      return true;
    });
  });

  await t.test("wrong key: AuthenticationError", async () => {
    await assert.rejects(Sandbox.list({ apiKey: "pds_00000000000000000000000000000000" }), (err: unknown) => {
      assert.ok(err instanceof AuthenticationError, String(err));
      assert.equal(err.code, "unauthorized");
      assert.equal(err.status, 401);
      return true;
    });
  });

  await t.test("out-of-range ttl: InvalidRequestError", async () => {
    await assert.rejects(Sandbox.create({ ttlSeconds: 10_000_000 }), (err: unknown) => {
      assert.ok(err instanceof InvalidRequestError, String(err));
      assert.equal(err.code, "invalid_request");
      assert.equal(err.status, 400);
      return true;
    });
  });

  await t.test("unknown template: NotFoundError", async () => {
    await assert.rejects(Sandbox.create({ template: "no-such-template" }), (err: unknown) => {
      assert.ok(err instanceof PandaStackError, String(err));
      assert.ok(err instanceof NotFoundError, `${err.name} ${err.code}`);
      return true;
    });
  });
});
