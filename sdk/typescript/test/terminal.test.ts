/**
 * Sandbox.terminal(): a real shell on a real terminal, over the WebSocket,
 * with the `ws` package's WebSocket (Node 20 has no global one).
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import WebSocket from "ws";
import {
  AuthenticationError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PandaStackError,
  Sandbox,
  SandboxStoppedError,
  type WebSocketConstructor,
} from "@pandastack/sdk";
import { haveServer, newSandbox } from "./helpers.js";

// The `ws` package's WebSocket fits the SDK's type as it is: no cast.
const WS: WebSocketConstructor = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket ?? WebSocket;

test("a terminal runs a shell as the sandbox user, resizes, and reports its exit", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  const term = await sb.terminal({ cols: 90, rows: 20, WebSocket: WS });
  term.write("PS1='ts> '; echo $((6*7)); stty size; whoami; echo E$((1+1))ND\r");
  const out = (await term.readUntil("E2ND")).replace(/\r/g, "");
  assert.ok(out.includes("42\n20 90\nuser\nE2ND"), out);

  // Resized at the next prompt: readline reads the size and writes it back
  // as it takes the terminal for a new line, undoing a resize in between.
  await term.readUntil("ts> ", { since: term.output.lastIndexOf("E2ND") });
  term.resize(120, 40);
  const mark = term.output.length;
  term.write("stty size\r");
  await term.readUntil("40 120", { since: mark });

  await assert.rejects(sb.snapshot(), ConflictError);
  term.write("exit 5\r");
  await term.closed;
  assert.equal(term.exitCode, 5);
  // Keys sent after the end would be lost: an error, not silence.
  assert.throws(() => term.write("echo late\r"), (err: unknown) => {
    assert.ok(err instanceof PandaStackError && err.code === "terminal_closed", String(err));
    assert.match(err.message, /status 5/);
    return true;
  });
});

test("write after close() is a terminal_closed error", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  const term = await sb.terminal({ WebSocket: WS });
  const closing = term.close();
  assert.throws(() => term.write("echo late\r"), (err: unknown) => err instanceof PandaStackError && err.code === "terminal_closed");
  await closing;
});

test("a terminal whose sandbox stops under it rejects with SandboxStoppedError", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  const term = await sb.terminal({ WebSocket: WS });
  term.write("echo up$((2+2))\r");
  await term.readUntil("up4");
  await sb.kill();
  await assert.rejects(term.readUntil("never"), (err: unknown) => {
    assert.ok(err instanceof SandboxStoppedError, String(err));
    assert.equal(err.code, "sandbox_stopped");
    assert.match(err.message, /was killed/);
    return true;
  });
  assert.throws(() => term.write("echo more\r"), SandboxStoppedError);
});

test("a terminal whose API key is revoked rejects with AuthenticationError, not a shell's exit", async (t) => {
  if (!haveServer(t)) return;
  const api = process.env.PANDASTACK_API ?? "http://localhost:8080";
  const auth = { Authorization: `Bearer ${process.env.PANDASTACK_API_KEY}`, "Content-Type": "application/json" };
  const made = (await (await fetch(`${api}/v1/api-keys`, { method: "POST", headers: auth, body: JSON.stringify({ name: "ts-terminal-revoke" }) })).json()) as { id: string; secret: string };
  const sb = await newSandbox(t);
  const term = await (await Sandbox.connect(sb.id, { apiKey: made.secret })).terminal({ WebSocket: WS });
  term.write("echo up$((2+2))\r");
  await term.readUntil("up4");
  assert.equal((await fetch(`${api}/v1/api-keys/${made.id}`, { method: "DELETE", headers: auth })).status, 204);
  await assert.rejects(term.readUntil("never"), (err: unknown) => {
    assert.ok(err instanceof AuthenticationError, String(err));
    assert.equal(err.code, "unauthorized");
    assert.match(err.message, /revoked/);
    return true;
  });
  assert.equal(term.exitCode, undefined);
  assert.throws(() => term.write("echo more\r"), AuthenticationError);
});

test("a terminal of a sandbox that is gone is refused with the API's typed error", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  await sb.kill();
  await assert.rejects(sb.terminal({ WebSocket: WS }), (err: unknown) => {
    assert.ok(err instanceof NotFoundError, String(err));
    assert.equal(err.status, 404);
    return true;
  });
});

test("a terminal that cannot open says why: a paused sandbox, a bad size", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  await assert.rejects(sb.terminal({ cols: 0, WebSocket: WS }), (err: unknown) => {
    assert.ok(err instanceof InvalidRequestError && /cols/.test(err.message), String(err));
    return true;
  });
  await sb.pause();
  await assert.rejects(sb.terminal({ WebSocket: WS }), (err: unknown) => {
    assert.ok(err instanceof ConflictError && /paused/.test(err.message) && err.status === 409, String(err));
    return true;
  });
});
