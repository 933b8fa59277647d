/**
 * Shared test helpers. The server comes from test/run.ts through
 * PANDASTACK_API / PANDASTACK_API_KEY; nothing here talks to anything but
 * that real server.
 */

import assert from "node:assert/strict";
import type { TestContext } from "node:test";
import {
  type CodeContext,
  type Execution,
  NotFoundError,
  PandaStackError,
  Sandbox,
  type SandboxCreateOptions,
} from "@pandastack/sdk";

export const CI = process.env.CI === "true";

/**
 * A prerequisite is missing: skip with the reason on a developer machine,
 * fail under CI=true (a skipped suite is not green). Returns false so the
 * caller can `return`.
 */
export function missing(t: TestContext, reason: string): false {
  if (CI) assert.fail(`${reason} (CI=true: a missing prerequisite fails)`);
  t.skip(reason);
  return false;
}

/** True when test/run.ts started a server; otherwise skips (or fails under CI). */
export function haveServer(t: TestContext): boolean {
  const why = process.env.PANDASTACK_TEST_NO_SERVER;
  if (why || !process.env.PANDASTACK_API_KEY) {
    return missing(t, `no PandaStack server for the tests: ${why ?? "PANDASTACK_API_KEY is not set (run `npm test`)"}`);
  }
  return true;
}

/** Creates a sandbox that is killed when the test ends. */
export async function newSandbox(t: TestContext, opts: SandboxCreateOptions = {}): Promise<Sandbox> {
  const sb = await Sandbox.create({ ttlSeconds: 600, ...opts, metadata: { suite: "ts-sdk", ...opts.metadata } });
  t.after(() => killQuietly(sb));
  return sb;
}

export async function killQuietly(sb: Sandbox): Promise<void> {
  try {
    await sb.kill();
  } catch (err) {
    if (!(err instanceof NotFoundError)) throw err;
  }
}

/**
 * Creates a code-interpreter sandbox, or skips (fails under CI) when this
 * server has no such template built yet.
 */
export async function codeSandbox(t: TestContext, opts: SandboxCreateOptions = {}): Promise<Sandbox | undefined> {
  if (!haveServer(t)) return undefined;
  try {
    return await newSandbox(t, { template: "code-interpreter", ...opts });
  } catch (err) {
    if (err instanceof PandaStackError && (err.code === "not_found" || err.code === "template_not_built")) {
      missing(
        t,
        `the code-interpreter template is not available on this server (${err.message}); ` +
          "start the tests with PANDASTACK_BUILD_ON_START=code-interpreter (the default)",
      );
      return undefined;
    }
    throw err;
  }
}

/**
 * For endpoints that are landing in parallel (snapshots, fork, pause): a
 * 404 "no route" answer means the server does not have them yet.
 */
export function isMissingRoute(err: unknown): boolean {
  return err instanceof NotFoundError && /no route/i.test(err.message);
}

/** Runs fn; on a missing route, skips (fails under CI) naming the endpoint. */
export async function needsEndpoint<T>(t: TestContext, what: string, fn: () => Promise<T>): Promise<T | undefined> {
  try {
    return await fn();
  } catch (err) {
    if (isMissingRoute(err)) {
      missing(t, `${what}: the server has no such endpoint yet (${(err as Error).message})`);
      return undefined;
    }
    throw err;
  }
}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

/** Asserts that a base64 string decodes to a PNG of a plausible size. */
export function assertPng(b64: string | undefined, minBytes = 1000): void {
  assert.ok(b64, "expected a base64 PNG");
  const bytes = Buffer.from(b64, "base64");
  assert.deepEqual([...bytes.subarray(0, 8)], PNG_SIGNATURE, "not a PNG signature");
  assert.ok(bytes.length >= minBytes, `PNG of only ${bytes.length} bytes`);
}

/**
 * Starts a run that prints "started" first and resolves once that output
 * arrived, so the caller knows the code is running. `done` settles with the
 * run; it is already observed, so a rejection is never "unhandled".
 */
export async function startRun(ctx: CodeContext, code: string): Promise<{ done: Promise<Execution>; seen: string[] }> {
  const seen: string[] = [];
  let started!: () => void;
  const first = new Promise<void>((r) => (started = r));
  const done = ctx.runCode(`print('started', flush=True)\n${code}`, {
    onStdout: (d) => {
      seen.push(d);
      started();
    },
  });
  await Promise.race([first, done]);
  return { done, seen };
}
