/**
 * Command results, background commands (`sandbox.exec(cmd, { background:
 * true })`) and `sandbox.commands`, which uses the names of E2B's SDK.
 */

import { PandaStackError, errorFromCode } from "./errors.js";
import { type HttpClient, streamError } from "./http.js";

/** The outcome of a command. A non-zero exit or a timeout is not an error. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  /** Exit status; -1 when a signal ended the command. */
  exitCode: number;
  /** Wall time from start to exit. */
  durationMs: number;
  /** True when `timeout` killed the command. */
  timedOut: boolean;
  /** Name of the signal that ended the command, if one did. */
  signal?: string;
  /** True when stdout went past the server's cap (4 MiB) and was cut; stream to get all. */
  stdoutTruncated?: boolean;
  /** True when stderr went past the server's cap and was cut. */
  stderrTruncated?: boolean;
}

/** @internal */
export interface WireExecResult {
  stdout?: string;
  stderr?: string;
  exit_code?: number;
  signal?: string;
  duration_ms?: number;
  timed_out?: boolean;
  stdout_truncated?: boolean;
  stderr_truncated?: boolean;
}

/** @internal */
export function toExecResult(w: WireExecResult, stdout: string, stderr: string): ExecResult {
  const r: ExecResult = {
    stdout,
    stderr,
    exitCode: w.exit_code ?? 0,
    durationMs: w.duration_ms ?? 0,
    timedOut: Boolean(w.timed_out),
  };
  if (w.signal) r.signal = w.signal;
  if (w.stdout_truncated) r.stdoutTruncated = true;
  if (w.stderr_truncated) r.stderrTruncated = true;
  return r;
}

/**
 * Folds a stream of exec events (a streamed exec, or a background process's
 * output) into its ExecResult, calling the callbacks as output comes.
 * @internal
 */
export async function collectExec(
  events: AsyncIterable<Record<string, unknown>>,
  opts: Pick<WaitOptions, "onStdout" | "onStderr">,
  what: string,
): Promise<ExecResult> {
  let stdout = "";
  let stderr = "";
  for await (const ev of events) {
    switch (ev.type) {
      case "stdout": {
        const data = String(ev.data ?? "");
        stdout += data;
        await opts.onStdout?.(data);
        break;
      }
      case "stderr": {
        const data = String(ev.data ?? "");
        stderr += data;
        await opts.onStderr?.(data);
        break;
      }
      case "exit":
        return toExecResult(ev as WireExecResult, stdout, stderr);
      case "error":
        throw streamError(ev.error);
      default:
    }
  }
  throw new PandaStackError(`${what}: the stream ended without an exit event (cut off?)`, "stream_error");
}

/** A background process as the server last described it. */
export interface ProcessInfo {
  /** Process id inside the sandbox. */
  pid: number;
  /** The shell command, or the argv joined by spaces. */
  cmd: string;
  cwd: string;
  startedAt: Date;
  running: boolean;
  /** Once it ended; -1 when a signal ended it. */
  exitCode?: number;
  signal?: string;
  timedOut?: boolean;
  /** Bytes of its oldest output no longer kept (the server keeps the latest, in at most 4 MiB of memory: less when it comes a line at a time while followed). */
  outputDropped?: number;
}

/** What `sandbox.killAllProcesses()` did. */
export interface ProcessesKilled {
  /** How many processes were killed. */
  killed: number;
  /**
   * Processes still found at the end, each sent a kill then: 0 unless they
   * forked faster than the kill went round for 10 s (call it again).
   */
  remaining: number;
}

/** @internal */
export interface WireProcess {
  pid: number;
  cmd?: string;
  cwd?: string;
  started_at?: string;
  running?: boolean;
  exit_code?: number;
  signal?: string;
  timed_out?: boolean;
  output_dropped?: number;
}

/** @internal */
export function toProcessInfo(w: WireProcess): ProcessInfo {
  const p: ProcessInfo = {
    pid: w.pid,
    cmd: w.cmd ?? "",
    cwd: w.cwd ?? "",
    startedAt: new Date(w.started_at ?? 0),
    running: Boolean(w.running),
  };
  if (w.exit_code !== undefined) p.exitCode = w.exit_code;
  if (w.signal) p.signal = w.signal;
  if (w.timed_out) p.timedOut = true;
  if (w.output_dropped) p.outputDropped = w.output_dropped;
  return p;
}

/** One chunk of a background command's output. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: string;
}

/** Options of `CommandHandle.wait`. */
export interface WaitOptions {
  /** As `ExecOptions.onStdout`: each chunk in order, a returned promise awaited. */
  onStdout?: (data: string) => unknown;
  onStderr?: (data: string) => unknown;
  /** Stops waiting (the command keeps running). */
  signal?: AbortSignal;
}

/** @internal */
export function processesPath(sandboxId: string, sub = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(sandboxId)}/processes${sub}`;
}

/**
 * A command running in the background in a sandbox. The server keeps its
 * output (the latest 4 MiB), so any handle reads it from the start, however
 * late. `for await (const chunk of handle)` yields its output until it
 * ends; `wait()` gathers it into an ExecResult.
 */
export class CommandHandle implements AsyncIterable<OutputChunk> {
  readonly sandboxId: string;
  /** As of the last answer about it; `refresh()` fetches it again. */
  info: ProcessInfo;
  readonly #http: HttpClient;

  /** @internal Use `sandbox.exec(cmd, { background: true })` or `sandbox.connectProcess(pid)`. */
  constructor(http: HttpClient, sandboxId: string, info: ProcessInfo) {
    this.#http = http;
    this.sandboxId = sandboxId;
    this.info = info;
  }

  /** The process id inside the sandbox. */
  get pid(): number {
    return this.info.pid;
  }

  #path(sub: string): string {
    return processesPath(this.sandboxId, `/${this.pid}${sub}`);
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    for await (const ev of this.#http.ndjson("GET", this.#path("/output"), { query: { follow: "true" }, long: true })) {
      if (ev.type === "stdout" || ev.type === "stderr") yield { stream: ev.type, data: String(ev.data ?? "") };
      else if (ev.type === "error") throw streamError(ev.error);
    }
  }

  /**
   * Waits for the command to end and returns its ExecResult, with its output
   * from the first byte kept; the callbacks see the output as it comes.
   */
  async wait(opts: WaitOptions = {}): Promise<ExecResult> {
    const events = this.#http.ndjson("GET", this.#path("/output"), { query: { follow: "true" }, signal: opts.signal, long: true });
    const res = await collectExec(events, opts, `process ${this.pid}`);
    await this.refresh();
    return res;
  }

  /** The output kept so far (the latest 4 MiB), without waiting for more. */
  async output(): Promise<{ stdout: string; stderr: string }> {
    let stdout = "";
    let stderr = "";
    for await (const ev of this.#http.ndjson("GET", this.#path("/output"))) {
      if (ev.type === "stdout") stdout += String(ev.data ?? "");
      else if (ev.type === "stderr") stderr += String(ev.data ?? "");
      else if (ev.type === "error") throw streamError(ev.error);
    }
    return { stdout, stderr };
  }

  /** Writes to the command's standard input; `eof` closes it afterwards. */
  async sendStdin(data: string, opts: { eof?: boolean } = {}): Promise<void> {
    await this.#http.empty("POST", this.#path("/stdin"), { json: { data, eof: Boolean(opts.eof) } });
  }

  /** SIGKILLs the command and everything it started; its output stays readable. */
  async kill(): Promise<void> {
    await this.#http.empty("POST", this.#path("/kill"));
  }

  /** Fetches `info` (running, exitCode, ...) again. */
  async refresh(): Promise<ProcessInfo> {
    const w = await this.#http.json<{ processes: WireProcess[] | null }>("GET", processesPath(this.sandboxId));
    const p = (w.processes ?? []).find((q) => q.pid === this.pid);
    if (p) this.info = toProcessInfo(p);
    return this.info;
  }
}

/** @internal */
export async function listProcesses(http: HttpClient, sandboxId: string): Promise<ProcessInfo[]> {
  const w = await http.json<{ processes: WireProcess[] | null }>("GET", processesPath(sandboxId));
  return (w.processes ?? []).map(toProcessInfo);
}

/** @internal */
export async function connectProcess(http: HttpClient, sandboxId: string, pid: number): Promise<CommandHandle> {
  const p = (await listProcesses(http, sandboxId)).find((q) => q.pid === pid);
  // Built as an answer's error is, so the message ends as every other one
  // does: "(not_found, HTTP 404)".
  if (!p) throw errorFromCode("not_found", `no background process ${pid} in sandbox ${sandboxId}`, 404);
  return new CommandHandle(http, sandboxId, p);
}
