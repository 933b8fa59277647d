/**
 * An interactive shell in a sandbox on a real terminal, over the WebSocket
 * `GET /v1/sandboxes/{id}/pty`.
 *
 * It uses the standard `WebSocket` (browsers, Node 22 and newer); on Node 20
 * pass one, e.g. `import WebSocket from "ws"` and `{ WebSocket }`. The key
 * rides as the subprotocol `bearer.<key>`, since the standard WebSocket
 * cannot set headers.
 */

import { APIConnectionError, PandaStackError, SandboxStoppedError, TimeoutError, errorFromCode } from "./errors.js";

/**
 * The close code of a terminal whose sandbox stopped under it (4000 plus the
 * HTTP status of `sandbox_stopped`); the reason says why.
 */
const closeSandboxStopped = 4410;

/**
 * WebSocket close codes the server ends a terminal with: the shell exited;
 * the server shuts down; the caller's key was revoked (or a bad message);
 * 1005 and 1006 come with no close frame from the server (the connection
 * was lost).
 */
const closeNormal = 1000,
  closeGoingAway = 1001,
  closePolicy = 1008,
  closeNoStatus = 1005,
  closeAbnormal = 1006;

/** Why a terminal closed by the server with code and reason ended, or undefined for its shell's exit. */
function endedBy(code: number, reason: string, exited: boolean): PandaStackError | undefined {
  if (code === closeSandboxStopped) {
    return new SandboxStoppedError(`${reason || "the sandbox has stopped"} (sandbox_stopped, HTTP 410)`, "sandbox_stopped", 410);
  }
  if (code === closePolicy && reason.includes("revoked")) return errorFromCode("unauthorized", reason, 401);
  if (code === closeGoingAway) return errorFromCode("sandbox_unavailable", reason || "the server is shutting down", 503);
  if (code === closeNoStatus || code === closeAbnormal) {
    return exited ? undefined : new APIConnectionError("the connection to the terminal was lost (no close from the server)", "connection_error");
  }
  if (code !== closeNormal) return new PandaStackError(`the terminal was closed (${code}): ${reason}`, "terminal_closed");
  return undefined;
}

/**
 * An event handler property of a WebSocket, written as a method's type:
 * TypeScript compares a method's parameters both ways, so a WebSocket whose
 * events carry more than the fields the terminal reads (the `ws`
 * package's) still fits.
 */
type Handler<E> = { handle(ev: E): void }["handle"];

/** The part of the standard WebSocket the terminal uses. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: string | ArrayBufferView | ArrayBuffer): void;
  close(code?: number, reason?: string): void;
  onopen: Handler<unknown> | null;
  onmessage: Handler<{ data: unknown }> | null;
  onclose: Handler<{ code: number; reason: string }> | null;
  onerror: Handler<unknown> | null;
}

/** A constructor of WebSockets, like the standard one or the `ws` package's. */
export type WebSocketConstructor = new (url: string, protocols?: string[]) => WebSocketLike;

/** Options of `Sandbox.terminal()`. */
export interface TerminalOptions {
  /** Columns; default 80. */
  cols?: number;
  /** Rows; default 24. */
  rows?: number;
  /** The WebSocket implementation; default the global one. */
  WebSocket?: WebSocketConstructor;
}

/**
 * A login shell of the sandbox user. Keys go in with `write` ("\r" is
 * Enter); output arrives through `onData` and `readUntil`. `close()` kills
 * the shell and everything it started. While it is open the sandbox counts
 * as busy: snapshot, fork and pause answer `ConflictError`.
 */
export class Terminal {
  /** The shell's exit status, once it exited. */
  exitCode?: number;
  /** Resolves when the session ends, whichever side ended it. */
  readonly closed: Promise<void>;
  /**
   * Set when the sandbox stopped under the terminal (killed, its TTL, out of
   * memory): what `readUntil` rejects with and `write` throws then.
   */
  stopped?: SandboxStoppedError;
  /**
   * Set when the terminal ended for another reason than its shell's exit or
   * `close()` (the sandbox stopped, the API key was revoked, the server shut
   * down, the connection was lost): what `readUntil` rejects with and
   * `write` throws then.
   */
  ended?: PandaStackError;
  #ws: WebSocketLike;
  #dec = new TextDecoder();
  #out = "";
  #listeners = new Set<(text: string) => void>();
  #done = false;
  #closing = false;

  private constructor(ws: WebSocketLike) {
    this.#ws = ws;
    this.closed = new Promise((resolve) => {
      ws.onclose = (ev) => {
        if (!this.#closing) {
          this.ended = endedBy(ev.code, ev.reason ?? "", this.exitCode !== undefined);
          if (this.ended instanceof SandboxStoppedError) this.stopped = this.ended;
        }
        this.#done = true;
        this.#emit("");
        resolve();
      };
    });
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        const m = JSON.parse(ev.data) as { type?: string; exit_code?: number };
        if (m.type === "exit") this.exitCode = m.exit_code;
        return;
      }
      const bytes = ev.data instanceof ArrayBuffer ? new Uint8Array(ev.data) : (ev.data as Uint8Array);
      this.#emit(this.#dec.decode(bytes, { stream: true }));
    };
  }

  /** Opens a terminal; rejects when the server refuses it. */
  static open(url: string, apiKey: string, sandboxId: string, opts: TerminalOptions = {}): Promise<Terminal> {
    const WS = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!WS) {
      return Promise.reject(
        new PandaStackError("this runtime has no WebSocket: pass one, e.g. { WebSocket } from the ws package", "no_websocket"),
      );
    }
    const q = new URLSearchParams({ cols: String(opts.cols ?? 80), rows: String(opts.rows ?? 24) });
    const ws = new WS(`${url.replace(/^http/, "ws")}/v1/sandboxes/${encodeURIComponent(sandboxId)}/pty?${q}`, [
      "pandastack.pty",
      `bearer.${apiKey}`,
    ]);
    ws.binaryType = "arraybuffer";
    return new Promise((resolve, reject) => {
      ws.onopen = () => resolve(new Terminal(ws));
      ws.onerror = (ev) => {
        const detail = (ev as { message?: string }).message ?? "";
        reject(new PandaStackError(`could not open the terminal of ${sandboxId}: ${detail || "the server refused it"}`, "terminal_refused"));
      };
    });
  }

  #emit(text: string): void {
    this.#out += text;
    for (const l of this.#listeners) l(text);
  }

  /** Calls fn with each piece of output ("" once the session ended). Returns an unsubscribe function. */
  onData(fn: (text: string) => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  /** Everything the terminal printed so far. */
  get output(): string {
    return this.#out;
  }

  /**
   * Sends keys to the shell; throws `ended` once the session ended for a
   * reason (`SandboxStoppedError` once its sandbox has stopped,
   * `AuthenticationError` once the key was revoked, ...), and a
   * `PandaStackError` (`terminal_closed`) once it was closed or the shell
   * exited: keys sent then would be lost.
   */
  write(data: string | Uint8Array): void {
    if (this.ended) throw this.ended;
    if (this.#done || this.#closing) {
      const why = this.exitCode !== undefined ? `the shell exited with status ${this.exitCode}` : "it was closed";
      throw new PandaStackError(`the terminal is closed (${why})`, "terminal_closed");
    }
    this.#ws.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /** Changes the terminal's size; the shell gets SIGWINCH. */
  resize(cols: number, rows: number): void {
    this.#ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /**
   * Waits until the output printed after `since` (an offset into `output`,
   * default 0) contains `text`, and returns the whole output.
   */
  readUntil(text: string, opts: { since?: number; timeoutMs?: number } = {}): Promise<string> {
    const since = opts.since ?? 0;
    const found = () => this.#out.indexOf(text, since) >= 0;
    if (found()) return Promise.resolve(this.#out);
    const ended = () => this.ended ?? new PandaStackError(`the terminal closed before ${JSON.stringify(text)} appeared`, "terminal_closed");
    if (this.#done) return Promise.reject(ended()); // no more output will come
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        off();
        reject(new TimeoutError(`${JSON.stringify(text)} did not appear within ${opts.timeoutMs ?? 60000} ms`, "timeout"));
      }, opts.timeoutMs ?? 60000);
      const off = this.onData(() => {
        if (found()) {
          clearTimeout(timer);
          off();
          resolve(this.#out);
        } else if (this.#done) {
          clearTimeout(timer);
          off();
          reject(ended());
        }
      });
    });
  }

  /** Ends the session: the shell and its children are killed. */
  close(): Promise<void> {
    this.#closing = true;
    if (!this.#done) this.#ws.close(1000);
    return this.closed;
  }
}
