/**
 * Code contexts: long-lived Jupyter kernels inside a sandbox, and the
 * Execution a run of code returns (stdout, stderr, rich results, error).
 */

import { NotFoundError, PandaStackError, SandboxStoppedError } from "./errors.js";
import { type HttpClient, streamError } from "./http.js";

/** Languages a code context can run. */
export type Language = "python" | "bash" | "javascript" | "typescript" | "r" | "java" | (string & {});

/**
 * One rich output of a run: a `display()`, a `plt.show()`, or the cell's last
 * expression (`isMainResult`). Each field holds one MIME representation;
 * binary ones (`png`, `jpeg`, `pdf`) are base64 strings.
 */
export interface Result {
  /** True for the cell's last expression (Jupyter's execute_result). */
  isMainResult: boolean;
  /** text/plain */
  text?: string;
  /** text/html, e.g. a DataFrame's table */
  html?: string;
  markdown?: string;
  svg?: string;
  /** image/png, base64 */
  png?: string;
  /** image/jpeg, base64 */
  jpeg?: string;
  /** application/pdf, base64 */
  pdf?: string;
  latex?: string;
  /** application/json, decoded */
  json?: unknown;
  javascript?: string;
  /** application/vnd.plotly.v1+json, decoded */
  plotly?: unknown;
  /** A displayed matplotlib figure's structure (code-interpreter template). */
  chart?: Chart;
  /** A displayed pandas DataFrame or Series as JSON values (code-interpreter template). */
  data?: Table;
  /** Other MIME types, keyed by MIME type. */
  extra?: Record<string, unknown>;
  /** The representations present, e.g. `["text", "png", "chart"]`, then the `extra` MIME types. */
  formats(): string[];
}

/**
 * One element of a Chart; its keys depend on the chart's type: line and
 * scatter have `label` and `points` (`[x, y]`, x or y an ISO 8601 string on
 * a datetime axis, a category on a categorical one); bar has `label`,
 * `value`, `group`; pie `label`, `angle` (degrees), `radius`;
 * box_and_whisker `label`, `min`, `first_quartile`, `median`,
 * `third_quartile`, `max`, `outliers`.
 */
export interface ChartElement {
  label?: string | null;
  points?: [unknown, unknown][];
  value?: number | null;
  group?: string | null;
  angle?: number | null;
  radius?: number | null;
  min?: number | null;
  first_quartile?: number | null;
  median?: number | null;
  third_quartile?: number | null;
  max?: number | null;
  outliers?: (number | null)[];
}

/**
 * The structure of a displayed matplotlib figure, read from the figure in
 * the sandbox. A superchart (several axes) has Charts as elements.
 * `truncated` says points or elements were left out (5000 points per line,
 * 1000 elements). Keys are as the API sends them (snake_case).
 */
export interface Chart {
  type: "line" | "scatter" | "bar" | "pie" | "box_and_whisker" | "superchart" | "unknown";
  title?: string | null;
  x_label?: string | null;
  y_label?: string | null;
  /** linear, log, symlog, logit, datetime or categorical */
  x_scale?: string;
  y_scale?: string;
  x_ticks?: unknown[];
  x_tick_labels?: string[];
  y_ticks?: unknown[];
  y_tick_labels?: string[];
  elements: (ChartElement | Chart)[];
  truncated?: boolean;
}

/**
 * A displayed pandas DataFrame or Series: at most 1000 rows and 200 columns
 * (`truncated` when cut); NaN is null, timestamps ISO 8601 strings.
 */
export interface Table {
  kind: "dataframe" | "series";
  columns: unknown[];
  dtypes: string[];
  index: unknown[];
  index_name?: unknown;
  /** A Series' name. */
  name?: string | null;
  rows: unknown[][];
  total_rows: number;
  total_columns: number;
  truncated?: boolean;
}

/**
 * The exception a run raised (or `TimeoutError`, `KernelDied`, ... for runs
 * the kernel could not finish). It is returned in `Execution.error`, never
 * thrown. `String(error)` is the traceback, so `` `ERROR:\n${ex.error}` ``
 * reads like Python's own report.
 */
export class ExecutionError {
  /** Exception class, e.g. `ZeroDivisionError`. */
  readonly name: string;
  /** The exception's message. */
  readonly value: string;
  /** The formatted traceback, plain text without ANSI escapes. */
  readonly traceback: string;

  constructor(name: string, value: string, traceback: string) {
    this.name = name;
    this.value = value;
    this.traceback = traceback;
  }

  toString(): string {
    const last = `${this.name}: ${this.value}`;
    if (!this.traceback) return last;
    return this.traceback.includes(this.name) ? this.traceback : `${this.traceback}\n${last}`;
  }
}

/** The whole outcome of one run of code. */
export interface Execution {
  /** Everything the run printed to standard output. */
  stdout: string;
  /** Everything the run printed to standard error. */
  stderr: string;
  /** The exception, if the run raised one; the context stays usable. */
  error?: ExecutionError;
  /** The main result's text/plain: the value of the cell's last expression. */
  text?: string;
  /** The run's first PNG (a `plt.show()`, say), base64. */
  png?: string;
  /** Every display and the main result, in order. */
  results: Result[];
  /** Jupyter's execution counter of the context. */
  executionCount: number;
  /** Wall time of the run in milliseconds. */
  durationMs: number;
  /**
   * The output under E2B's name: `logs.stdout` and `logs.stderr` as lists of
   * chunks (here the whole text as one chunk, none when empty).
   */
  readonly logs: { stdout: string[]; stderr: string[] };
  /** The Result of the cell's last expression, if any (Python's `main_result`). */
  readonly mainResult: Result | undefined;
}

/**
 * Options of a run. Giving any callback streams the run: the callbacks are
 * called one at a time, in the order the kernel produced the output (a
 * callback that returns a promise is awaited before the next one), and the
 * returned Execution still holds everything.
 */
export interface RunCodeOptions {
  /**
   * Seconds the code may run (server default 300). On expiry the kernel is
   * interrupted and `error.name` is `TimeoutError`; earlier variables survive.
   */
  timeout?: number;
  /** Environment variables for this run only. */
  env?: Record<string, string>;
  /**
   * Called as the run produces each piece, in order, one at a time (a
   * returned promise is awaited; any other value is ignored, so
   * `(d) => process.stdout.write(d)` will do).
   */
  onStdout?: (data: string) => unknown;
  onStderr?: (data: string) => unknown;
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
  /** Aborts the request; the server then stops waiting for the run. */
  signal?: AbortSignal;
}

/** Options of a new code context. */
export interface CreateCodeContextOptions {
  /** `python` (the default), `bash`, `javascript`, `typescript`, `r` or `java`. */
  language?: Language;
  /** Working directory of the kernel; default `/home/user`. */
  cwd?: string;
  /** Environment variables of the kernel. */
  env?: Record<string, string>;
  /**
   * When the kernel dies (a crash, `os._exit`, out of memory), the next run
   * restarts it and fails with `KernelRestarted` without running (the state
   * is lost); later runs work. `false`: runs fail with a `ConflictError`
   * until `restart()`. Default `true`.
   */
  autoRestart?: boolean;
}

/** @internal wire shapes */
export interface WireContext {
  id: string;
  language: string;
  cwd: string;
  auto_restart?: boolean;
}

interface WireResult {
  is_main_result?: boolean;
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
  plotly?: unknown;
  chart?: Chart;
  data?: Table;
  extra?: Record<string, unknown>;
}

/** Result fields in the order `formats()` reports them. */
const RESULT_FORMATS = [
  "text",
  "html",
  "markdown",
  "svg",
  "png",
  "jpeg",
  "pdf",
  "latex",
  "json",
  "javascript",
  "plotly",
  "chart",
  "data",
] as const;

function formats(this: Result): string[] {
  const out: string[] = RESULT_FORMATS.filter((k) => this[k] !== undefined);
  return out.concat(Object.keys(this.extra ?? {}).sort());
}

interface WireError {
  name?: string;
  value?: string;
  traceback?: string | string[];
}

interface WireExecution {
  execution_count?: number;
  stdout?: string;
  stderr?: string;
  text?: string;
  png?: string;
  error?: WireError | null;
  results?: WireResult[] | null;
  duration_ms?: number;
}

function toResult(w: WireResult): Result {
  const r = { isMainResult: Boolean(w.is_main_result) } as Result;
  // Not enumerable: a Result still compares and prints as its data.
  Object.defineProperty(r, "formats", { value: formats, enumerable: false });
  for (const k of ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "javascript"] as const) {
    if (typeof w[k] === "string") r[k] = w[k];
  }
  if (w.json !== undefined) r.json = w.json;
  if (w.plotly !== undefined) r.plotly = w.plotly;
  if (w.chart != null) r.chart = w.chart;
  if (w.data != null) r.data = w.data;
  if (w.extra && Object.keys(w.extra).length > 0) r.extra = w.extra;
  return r;
}

function toExecutionError(w: WireError): ExecutionError {
  const tb = Array.isArray(w.traceback) ? w.traceback.join("\n") : (w.traceback ?? "");
  return new ExecutionError(w.name ?? "Error", w.value ?? "", tb);
}

function toExecution(w: WireExecution): Execution {
  const ex = {
    stdout: w.stdout ?? "",
    stderr: w.stderr ?? "",
    results: (w.results ?? []).map(toResult),
    executionCount: w.execution_count ?? 0,
    durationMs: w.duration_ms ?? 0,
  } as Execution;
  Object.defineProperty(ex, "logs", {
    enumerable: false,
    get(this: Execution) {
      return { stdout: this.stdout ? [this.stdout] : [], stderr: this.stderr ? [this.stderr] : [] };
    },
  });
  Object.defineProperty(ex, "mainResult", {
    enumerable: false,
    get(this: Execution) {
      return this.results.find((r) => r.isMainResult);
    },
  });
  if (w.error) ex.error = toExecutionError(w.error);
  if (typeof w.text === "string") ex.text = w.text;
  if (typeof w.png === "string" && w.png) ex.png = w.png;
  return ex;
}

/**
 * Runs code on `path` (a context's /run or the sandbox's /run_code), as one
 * JSON answer or, when a callback is given, as an NDJSON stream.
 * @internal
 */
export async function runCode(
  http: HttpClient,
  path: string,
  body: Record<string, unknown>,
  opts: RunCodeOptions,
): Promise<Execution> {
  if (opts.timeout !== undefined) body.timeout_seconds = opts.timeout;
  if (opts.env !== undefined) body.env = opts.env;
  const streaming = Boolean(opts.onStdout || opts.onStderr || opts.onResult || opts.onError);
  if (!streaming) {
    return toExecution(await http.json<WireExecution>("POST", path, { json: body, signal: opts.signal, long: true }));
  }
  let sawError = false;
  for await (const ev of http.ndjson("POST", path, { json: body, signal: opts.signal, long: true })) {
    switch (ev.type) {
      case "stdout":
        await opts.onStdout?.(String(ev.data ?? ""));
        break;
      case "stderr":
        await opts.onStderr?.(String(ev.data ?? ""));
        break;
      case "result":
        if (ev.result) await opts.onResult?.(toResult(ev.result as WireResult));
        break;
      case "error": {
        // The kernel's exception has a name; a failure of the server or the
        // sandbox part-way has an error code instead.
        const e = ev.error as WireError | undefined;
        if (e && typeof e.name === "string") {
          sawError = true;
          await opts.onError?.(toExecutionError(e));
        } else throw streamError(ev.error);
        break;
      }
      case "execution": {
        const ex = toExecution((ev.execution ?? {}) as WireExecution);
        // A run that failed after its stream began (the sandbox stopped
        // under it, say) reports its error only here: onError still hears
        // of it, as in the Python SDK.
        if (ex.error && !sawError) await opts.onError?.(ex.error);
        return ex;
      }
      default:
      // Unknown event types from a newer server are ignored.
    }
  }
  throw new PandaStackError(`${path}: the stream ended without its final execution event (cut off?)`, "stream_error");
}

/**
 * A persistent kernel in a sandbox: variables, imports and DataFrames carry
 * over from one `runCode` to the next, as in a notebook. Runs in one context
 * happen one at a time; a run while another runs is a `ConflictError`.
 */
export class CodeContext {
  /** `ctx_...` */
  readonly id: string;
  /** The sandbox this kernel runs in. */
  readonly sandboxId: string;
  readonly language: Language;
  readonly cwd: string;
  /** Whether a run on a dead kernel restarts it first (see `CreateCodeContextOptions`). */
  readonly autoRestart: boolean;
  readonly #http: HttpClient;

  /** @internal Use `sandbox.createCodeContext()`. */
  constructor(http: HttpClient, sandboxId: string, w: WireContext) {
    this.#http = http;
    this.sandboxId = sandboxId;
    this.id = w.id;
    this.language = w.language;
    this.cwd = w.cwd;
    this.autoRestart = w.auto_restart ?? true;
  }

  #path(sub = ""): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/contexts/${encodeURIComponent(this.id)}${sub}`;
  }

  /**
   * Runs code and returns its Execution. A Python exception does not throw:
   * it is in `execution.error`. Throws only when the run could not happen
   * (e.g. `NotFoundError` for a closed context, `ConflictError` while
   * another run is going on, `SandboxUnavailableError`).
   */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.#http, this.#path("/run"), { code }, opts);
  }

  /** Interrupts the running code (SIGINT to the kernel), like Ctrl-C. */
  async interrupt(): Promise<void> {
    await this.#http.empty("POST", this.#path("/interrupt"));
  }

  /** Restarts the kernel: its variables are gone, the context id stays. */
  async restart(): Promise<void> {
    await this.#http.empty("POST", this.#path("/restart"));
  }

  /**
   * Shuts the kernel down; the context cannot be used afterwards. Closing a
   * context that is already gone (or whose sandbox is gone: killed, or
   * stopped by its TTL or a failure) is not an error.
   */
  async close(): Promise<void> {
    try {
      await this.#http.empty("DELETE", this.#path());
    } catch (e) {
      if (!(e instanceof NotFoundError || e instanceof SandboxStoppedError)) throw e;
    }
  }
}
