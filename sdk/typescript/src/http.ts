/**
 * The HTTP layer: configuration from options or the environment, JSON
 * requests, raw bodies, NDJSON streams, and the mapping of error answers to
 * typed errors. Internal; the public surface is Sandbox and friends.
 */

import {
  APIConnectionError,
  AuthenticationError,
  PandaStackError,
  TimeoutError,
  codeForStatus,
  errorFromCode,
} from "./errors.js";
import { FrameDecoder, STREAM_MEDIA_TYPE } from "./frames.js";

/** Where the SDK looks when `apiUrl` is neither passed nor in PANDASTACK_API. */
export const DEFAULT_API_URL = "http://localhost:8080";

/** How to reach a server. Every field falls back to the environment. */
export interface ConnectionOptions {
  /** API key (`pds_...`). Default: the PANDASTACK_API_KEY environment variable. */
  apiKey?: string;
  /** Server URL. Default: PANDASTACK_API, else `http://localhost:8080`. */
  apiUrl?: string;
  /**
   * How long a request may wait for the server's answer to begin, in
   * milliseconds; past it the request is aborted with a `TimeoutError` of
   * code `client_timeout`. Requests whose answer comes only as their work
   * goes (exec, runCode, following a process's output, file uploads) are
   * not bounded by it: give them their own `timeout` or a `signal`.
   * Default: no limit.
   */
  timeoutMs?: number;
}

type Query = Record<string, string | undefined>;

interface RequestOptions {
  query?: Query;
  /** Encoded as the JSON body. */
  json?: unknown;
  /** A raw body. (Not DOM's BodyInit, so the .d.ts files need no DOM lib.) */
  body?: string | Uint8Array | ArrayBuffer | Blob;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /**
   * The answer comes only as the work goes (an exec, a run of code, a
   * followed output, an upload): not bounded by timeoutMs.
   */
  long?: boolean;
}

function env(name: string): string | undefined {
  // Read at call time (not import time) so tests and long-lived processes
  // see the current value; guarded so the SDK loads where `process` is absent.
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v === undefined || v === "" ? undefined : v;
}

/** A resolved connection: one server, one key. */
export class HttpClient {
  readonly apiUrl: string;
  readonly apiKey: string;
  readonly timeoutMs: number | undefined;

  private constructor(apiUrl: string, apiKey: string, timeoutMs?: number) {
    this.apiUrl = apiUrl;
    this.apiKey = apiKey;
    this.timeoutMs = timeoutMs;
  }

  /** Resolves options against the environment; throws when no key is found. */
  static resolve(opts: ConnectionOptions = {}): HttpClient {
    const apiKey = opts.apiKey ?? env("PANDASTACK_API_KEY");
    if (!apiKey) {
      throw new AuthenticationError(
        "PANDASTACK_API_KEY is not set: export the API key that `pandastack serve` printed on its first start " +
          "(also saved in <data dir>/api-key), or pass { apiKey } explicitly",
        "missing_api_key",
      );
    }
    let apiUrl = (opts.apiUrl ?? env("PANDASTACK_API") ?? DEFAULT_API_URL).trim().replace(/\/+$/, "");
    if (!apiUrl.includes("://")) apiUrl = "http://" + apiUrl; // host:port, as the Python SDK takes it
    if (opts.timeoutMs !== undefined && !(opts.timeoutMs > 0)) {
      throw new TypeError(`timeoutMs must be a positive number of milliseconds, got ${opts.timeoutMs}`);
    }
    return new HttpClient(apiUrl, apiKey, opts.timeoutMs);
  }

  /** Sends a request and returns the response once it is known to be a success. */
  async fetch(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    let url = this.apiUrl + path;
    if (opts.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(opts.query)) if (v !== undefined) q.append(k, v);
      const s = q.toString();
      if (s) url += "?" + s;
    }
    const headers: Record<string, string> = { Authorization: `Bearer ${this.apiKey}`, ...opts.headers };
    let body = opts.body as BodyInit | undefined;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["Content-Type"] = "application/json";
    }
    let resp: Response;
    // timeoutMs bounds the wait for the answer to begin, not its body.
    let signal = opts.signal;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    if (this.timeoutMs !== undefined && !opts.long) {
      const ctrl = new AbortController();
      timer = setTimeout(() => {
        timedOut = true;
        ctrl.abort();
      }, this.timeoutMs);
      signal = opts.signal ? AbortSignal.any([opts.signal, ctrl.signal]) : ctrl.signal;
    }
    try {
      resp = await fetch(url, { method, headers, body, signal });
    } catch (err) {
      if (timedOut && !opts.signal?.aborted) {
        throw new TimeoutError(
          `${method} ${url}: no answer within timeoutMs (${this.timeoutMs} ms) (client_timeout)`,
          "client_timeout",
          undefined,
          { cause: err },
        );
      }
      throw connectionError(err, method, url);
    } finally {
      clearTimeout(timer);
    }
    if (!resp.ok) throw await errorFromResponse(resp);
    return resp;
  }

  /**
   * Sends a request and reads its raw body. A body that breaks off (the
   * server aborts a download that failed midway) rejects with a
   * `stream_error`, never resolves with a truncated body.
   */
  async bytes(method: string, path: string, opts: RequestOptions = {}): Promise<Uint8Array> {
    const resp = await this.fetch(method, path, opts);
    try {
      return new Uint8Array(await resp.arrayBuffer());
    } catch (err) {
      if (isAbort(err)) throw err;
      throw new PandaStackError(`${method} ${path}: the download broke off: ${describe(err)}`, "stream_error", resp.status, {
        cause: err,
      });
    }
  }

  /** Sends a request and decodes its JSON answer. */
  async json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const resp = await this.fetch(method, path, opts);
    const text = await resp.text();
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new PandaStackError(
        `${method} ${path}: the server answered ${resp.status} with a body that is not JSON: ${text.slice(0, 200)}`,
        "bad_response",
        resp.status,
        { cause: err },
      );
    }
  }

  /** Sends a request whose answer has no body we need (204 and friends). */
  async empty(method: string, path: string, opts: RequestOptions = {}): Promise<void> {
    const resp = await this.fetch(method, path, opts);
    await resp.body?.cancel();
  }

  /**
   * Sends a request asking for NDJSON and yields each decoded line as it
   * arrives. A request error before the stream starts is thrown as usual.
   */
  async *ndjson(method: string, path: string, opts: RequestOptions = {}): AsyncGenerator<Record<string, unknown>> {
    const resp = await this.fetch(method, path, {
      ...opts,
      headers: { ...opts.headers, Accept: "application/x-ndjson" },
    });
    yield* this.#lines(method, path, resp);
  }

  /**
   * Like ndjson, for a streamed exec: asks for the binary frames (raw
   * output, no JSON per chunk) and yields the same events, decoded from
   * whichever form the server answers in.
   */
  async *execEvents(method: string, path: string, opts: RequestOptions = {}): AsyncGenerator<Record<string, unknown>> {
    const resp = await this.fetch(method, path, {
      ...opts,
      headers: { ...opts.headers, Accept: `${STREAM_MEDIA_TYPE}, application/x-ndjson` },
    });
    if (!(resp.headers.get("content-type") ?? "").startsWith(STREAM_MEDIA_TYPE)) {
      yield* this.#lines(method, path, resp); // a server older than the frames
      return;
    }
    if (!resp.body) return;
    const frames = new FrameDecoder();
    yield* this.#decode(method, path, resp, resp.body.getReader(), (chunk) => frames.feed(chunk), () => {
      frames.finish();
      return [];
    });
  }

  async *#lines(method: string, path: string, resp: Response): AsyncGenerator<Record<string, unknown>> {
    if (!resp.body) return;
    let buf = "";
    const lines = (chunk: string): Record<string, unknown>[] => {
      buf += chunk;
      const out: Record<string, unknown>[] = [];
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (line) out.push(parseLine(line));
      }
      return out;
    };
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    yield* this.#decode(method, path, resp, reader, lines, () => (buf.trim() ? [parseLine(buf.trim())] : []));
  }

  /** Reads a streamed answer chunk by chunk, yielding what feed makes of each and, at its end, of end. */
  async *#decode<C>(
    method: string,
    path: string,
    resp: Response,
    reader: ReadableStreamDefaultReader<C>,
    feed: (chunk: C) => Record<string, unknown>[],
    end: () => Record<string, unknown>[],
  ): AsyncGenerator<Record<string, unknown>> {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        yield* feed(value);
      }
      yield* end();
    } catch (err) {
      if (err instanceof PandaStackError) throw err;
      if (isAbort(err)) throw err;
      throw new PandaStackError(`${method} ${path}: the stream broke off: ${describe(err)}`, "stream_error", resp.status, {
        cause: err,
      });
    } finally {
      // Stopping early (a callback threw, the caller broke out) cancels the
      // body, which closes the connection: the server then stops the command.
      await reader.cancel().catch(() => {});
      reader.releaseLock();
    }
  }
}

function parseLine(line: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(line);
    if (v && typeof v === "object") return v as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw new PandaStackError(`bad stream event from the server: ${line.slice(0, 200)}`, "bad_response");
}

/** Turns an error answer into the typed error for its code. */
export async function errorFromResponse(resp: Response): Promise<PandaStackError> {
  let text = "";
  try {
    text = await resp.text();
  } catch {
    // keep the status alone
  }
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    if (body?.error && typeof body.error.code === "string") {
      return errorFromCode(body.error.code, String(body.error.message ?? ""), resp.status);
    }
  } catch {
    // not the API's error shape
  }
  const message = text.trim().slice(0, 500) || resp.statusText || "no body";
  return errorFromCode(codeForStatus(resp.status), `HTTP ${resp.status}: ${message}`, resp.status);
}

/**
 * Reads an `error` event's payload. The API documents `{code, message}`;
 * the server currently nests it once more as `{error: {code, message}}`, so
 * both are accepted.
 */
export function streamError(payload: unknown): PandaStackError {
  let e = payload as { code?: unknown; message?: unknown; error?: unknown } | undefined;
  if (e && typeof e.code !== "string" && e.error && typeof e.error === "object") {
    e = e.error as typeof e;
  }
  if (e && typeof e.code === "string") return errorFromCode(e.code, String(e.message ?? ""));
  return new PandaStackError(`the server reported an error mid-stream: ${JSON.stringify(payload)}`, "stream_error");
}

function isAbort(err: unknown): boolean {
  return err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError");
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message}: ${cause.message}` : err.message;
  }
  return String(err);
}

function connectionError(err: unknown, method: string, url: string): unknown {
  // An abort is the caller's decision: let their AbortError through as is.
  if (isAbort(err)) return err;
  return new APIConnectionError(
    `cannot reach PandaStack at ${url} (${method}): ${describe(err)}. ` +
      "Is `pandastack serve` running, and does PANDASTACK_API point at it?",
    "connection_error",
    undefined,
    { cause: err },
  );
}
