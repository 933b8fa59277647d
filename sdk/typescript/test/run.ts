/**
 * `npm test`: starts a real `pandastack serve` on a free loopback port with a
 * fresh data dir, points the SDK at it through PANDASTACK_API and
 * PANDASTACK_API_KEY (as a user would), runs the test files with node's test
 * runner, then kills every sandbox left, stops the server with SIGTERM and
 * removes the data dir.
 *
 * The binary is $PANDASTACK_BIN, else <repo>/bin/pandastack (built by
 * `./scripts/setup.sh`). Serving needs root. Without either, the tests
 * that need a server skip with a hint; under CI=true they fail instead.
 *
 * Extra arguments go to `node --test` (e.g. `npm test -- --test-name-pattern=files`);
 * arguments ending in `.js` replace the default list of test files.
 *
 * Environment knobs: PANDASTACK_BUILD_ON_START (default code-interpreter: the
 * template is built on the first start, slow once and cached after),
 * PANDASTACK_CACHE_DIR (default /var/cache/pandastack),
 * PANDASTACK_TEST_START_TIMEOUT (seconds to wait for /healthz, default 2400).
 */

import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream, existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url)); // <pkg>/test-dist
const pkgDir = resolve(here, "..");
const repoDir = resolve(pkgDir, "../..");

function log(msg: string): void {
  process.stderr.write(`[test-run] ${msg}\n`);
}

function findBinary(): { bin?: string; why?: string } {
  let bin = process.env.PANDASTACK_BIN || join(repoDir, "bin", "pandastack");
  if (existsSync(bin) && statSync(bin).isDirectory()) bin = join(bin, "pandastack");
  if (!existsSync(bin)) {
    return { why: `no pandastack binary at ${bin}: build it with \`./scripts/setup.sh\` or set PANDASTACK_BIN` };
  }
  if (process.getuid?.() !== 0) {
    return { why: "`pandastack serve` needs root (gVisor creates namespaces and cgroups): run the tests as root" };
  }
  return { bin };
}

function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (addr && typeof addr === "object" ? ok(addr.port) : fail(new Error("no port"))));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Server {
  proc: ChildProcess;
  url: string;
  key: string;
  dataDir: string;
  logPath: string;
  exited: Promise<number | null>;
}

async function startServer(bin: string): Promise<Server> {
  const dataDir = await mkdtemp(join(tmpdir(), "pandastack-ts-sdk-"));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const logPath = join(dataDir, "serve.log");
  const logFile = createWriteStream(logPath);
  const buildOnStart = process.env.PANDASTACK_BUILD_ON_START ?? "code-interpreter";
  log(`starting ${bin} serve on ${url} (data dir ${dataDir}, build on start: ${buildOnStart || "none"})`);
  const proc = spawn(bin, ["serve"], {
    env: {
      ...process.env,
      PANDASTACK_LISTEN: `127.0.0.1:${port}`,
      PANDASTACK_DATA_DIR: dataDir,
      PANDASTACK_KILL_ON_EXIT: "1",
      PANDASTACK_CACHE_DIR: process.env.PANDASTACK_CACHE_DIR || "/var/cache/pandastack",
      PANDASTACK_BUILD_ON_START: buildOnStart,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  // Until the server is healthy its output (a template build's progress) is
  // shown; afterwards it only goes to the log file.
  let echo = true;
  for (const stream of [proc.stdout!, proc.stderr!]) {
    stream.on("data", (chunk: Buffer) => {
      logFile.write(chunk);
      if (echo) process.stderr.write(chunk.toString().replace(/^(?=.)/gm, "[serve] "));
    });
  }
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  let gone = false;
  void exited.then(() => (gone = true));

  const limit = Number(process.env.PANDASTACK_TEST_START_TIMEOUT || 2400) * 1000;
  const deadline = Date.now() + limit;
  for (;;) {
    if (gone) {
      throw new Error(`pandastack serve exited during startup (code ${proc.exitCode}); its output is above`);
    }
    try {
      const resp = await fetch(`${url}/healthz`);
      if (resp.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      proc.kill("SIGTERM");
      throw new Error(`pandastack serve did not answer /healthz within ${limit / 1000}s`);
    }
    await sleep(200);
  }
  echo = false;
  const key = (await readFile(join(dataDir, "api-key"), "utf8")).trim();
  log(`server up at ${url}`);
  return { proc, url, key, dataDir, logPath, exited };
}

async function api(s: Server, method: string, path: string): Promise<Response> {
  return fetch(s.url + path, { method, headers: { Authorization: `Bearer ${s.key}` } });
}

/** Kills every sandbox of the server's project, whatever its state. */
async function killLeftovers(s: Server): Promise<void> {
  const ids = new Set<string>();
  for (const q of ["", "?state=all"]) {
    try {
      const resp = await api(s, "GET", `/v1/sandboxes${q}`);
      if (!resp.ok) continue;
      const body = (await resp.json()) as { sandboxes?: { id: string }[] };
      for (const sb of body.sandboxes ?? []) ids.add(sb.id);
    } catch (err) {
      log(`listing sandboxes failed: ${String(err)}`);
    }
  }
  for (const id of ids) {
    const resp = await api(s, "DELETE", `/v1/sandboxes/${id}`).catch((err) => err as Error);
    if (resp instanceof Error) log(`kill ${id}: ${resp.message}`);
    else if (resp.status !== 204 && resp.status !== 404) log(`kill ${id}: HTTP ${resp.status} ${await resp.text()}`);
  }
  if (ids.size > 0) log(`killed ${ids.size} leftover sandbox(es)`);
}

async function stopServer(s: Server): Promise<void> {
  s.proc.kill("SIGTERM");
  const code = await Promise.race([s.exited, sleep(20_000).then(() => "timeout" as const)]);
  if (code === "timeout") {
    log("serve did not exit within 20 s of SIGTERM; killing it");
    s.proc.kill("SIGKILL");
    await s.exited;
  }
}

function testFiles(args: string[]): { files: string[]; flags: string[] } {
  const picked = args.filter((a) => a.endsWith(".js"));
  const flags = args.filter((a) => !a.endsWith(".js"));
  const files = picked.length
    ? picked
    : readdirSync(here)
        .filter((f) => f.endsWith(".test.js"))
        .sort()
        .map((f) => join(here, f));
  return { files, flags };
}

async function main(): Promise<number> {
  const { bin, why } = findBinary();
  const env: NodeJS.ProcessEnv = { ...process.env };
  let server: Server | undefined;
  if (bin) {
    try {
      server = await startServer(bin);
    } catch (err) {
      log(String(err instanceof Error ? err.message : err));
      return 1;
    }
    env.PANDASTACK_API = server.url;
    env.PANDASTACK_API_KEY = server.key;
    delete env.PANDASTACK_TEST_NO_SERVER;
  } else {
    log(`no server: ${why}`);
    env.PANDASTACK_TEST_NO_SERVER = why;
    delete env.PANDASTACK_API_KEY;
  }

  const { files, flags } = testFiles(process.argv.slice(2));
  // Files run one after the other: each creates sandboxes, and a small host
  // has room for only a few code-interpreter sandboxes at once.
  if (!flags.some((f) => f.startsWith("--test-reporter"))) flags.push("--test-reporter=spec");
  const child = spawn(process.execPath, ["--test", "--test-concurrency=1", ...flags, ...files], {
    env,
    stdio: "inherit",
    cwd: pkgDir,
  });
  const forward = (sig: NodeJS.Signals) => child.kill(sig);
  process.on("SIGINT", forward);
  process.on("SIGTERM", forward);
  const code = await new Promise<number>((r) => child.once("exit", (c, sig) => r(c ?? (sig ? 1 : 0))));

  if (server) {
    await killLeftovers(server);
    await stopServer(server);
    if (code !== 0) {
      const lines = readFileSync(server.logPath, "utf8").trimEnd().split("\n");
      log(`tests failed; last lines of the server log:\n${lines.slice(-60).join("\n")}`);
    }
    await rm(server.dataDir, { recursive: true, force: true }).catch((err) =>
      log(`could not remove ${server!.dataDir}: ${String(err)}`),
    );
  }
  return code;
}

process.exitCode = await main();
