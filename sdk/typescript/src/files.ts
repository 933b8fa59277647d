/**
 * Files inside a running sandbox. Paths are absolute, or relative to
 * `/home/user`, the sandbox user's home and default working directory.
 */

import { NotFoundError, PandaStackError } from "./errors.js";
import { type HttpClient, streamError } from "./http.js";

/** A file as the sandbox describes it. */
export interface FileInfo {
  /** Base name. */
  name: string;
  /** Absolute path inside the sandbox. */
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  /** Size in bytes. */
  size: number;
  /** Permission bits in octal, e.g. `0644`. */
  mode: string;
  modTime: Date;
}

/**
 * One change in a watched directory (`files.watchDir`). `type` is `create`
 * (made, or moved here), `write` (contents changed; writes in a row come as
 * one), `remove`, `rename` (moved away from `path`; its new name, if
 * watched, comes as a `create`), `chmod` (permissions, owner or times) or
 * `overflow` (changes were lost: list the directory again).
 */
export interface FileEvent {
  type: "create" | "write" | "remove" | "rename" | "chmod" | "overflow";
  /** Absolute path of the file the change is about. */
  path: string;
  /** `path` relative to the watched directory. */
  name: string;
  isDir: boolean;
}

/** Options of `files.watchDir`. */
export interface WatchOptions {
  /** Watch every directory beneath too, those made later included. */
  recursive?: boolean;
  /** Called once when the watch ends: with no error after `stop()` or the directory's removal, else with the failure. */
  onExit?: (err?: Error) => void;
  /** Aborting it ends the watch (as `stop()`), or the wait for it to start. */
  signal?: AbortSignal;
}

/** A running directory watch, from `files.watchDir`. */
export class WatchHandle {
  readonly #abort: AbortController;
  readonly #done: Promise<void>;
  #error: Error | undefined;

  /** @internal */
  constructor(abort: AbortController, run: Promise<void>, onExit?: (err?: Error) => void) {
    this.#abort = abort;
    const exit = (err?: Error) => {
      try {
        onExit?.(err);
      } catch {
        // The caller's callback: its failure must not become an unhandled rejection.
      }
    };
    this.#done = run.then(
      () => exit(),
      (err: unknown) => {
        this.#error = err instanceof Error ? err : new PandaStackError(String(err), "stream_error");
        exit(this.#error);
      },
    );
  }

  /** Ends the watch; resolves once it has ended. */
  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#done;
  }

  /** Resolves when the watch ends; rejects with its failure (the sandbox stopped or paused). */
  async wait(): Promise<void> {
    await this.#done;
    if (this.#error) throw this.#error;
  }
}

function toFileEvent(ev: Record<string, unknown>): FileEvent {
  return { type: ev.type as FileEvent["type"], path: String(ev.path ?? ""), name: String(ev.name ?? ""), isDir: Boolean(ev.is_dir) };
}

/** What `files.write` accepts: text (written as UTF-8) or bytes. */
export type FileData = string | Uint8Array | ArrayBuffer | Blob;

/** @internal */
export interface WireFileInfo {
  name: string;
  path: string;
  type: FileInfo["type"];
  size: number;
  mode: string;
  mod_time: string;
}

function toFileInfo(w: WireFileInfo): FileInfo {
  return { name: w.name, path: w.path, type: w.type, size: w.size, mode: w.mode, modTime: new Date(w.mod_time) };
}

/** The files of one sandbox; reach it as `sandbox.files`. */
export class Files {
  readonly #http: HttpClient;
  readonly #base: string;
  readonly #sandbox: string;

  /** @internal */
  constructor(http: HttpClient, sandboxId: string) {
    this.#http = http;
    this.#sandbox = `/v1/sandboxes/${encodeURIComponent(sandboxId)}`;
    this.#base = `${this.#sandbox}/files`;
  }

  /**
   * Writes a file, replacing an existing one atomically (its mode is kept;
   * a new file gets 0644). Missing parent directories are created.
   */
  async write(path: string, data: FileData): Promise<FileInfo> {
    // Checked here: fetch would send anything else as its String(), so
    // 123 or an object would be written as "123" or "[object Object]".
    if (
      typeof data !== "string" &&
      !(data instanceof Uint8Array) &&
      !(data instanceof ArrayBuffer) &&
      !(typeof Blob !== "undefined" && data instanceof Blob)
    ) {
      throw new TypeError(`files.write: data must be a string, Uint8Array, ArrayBuffer or Blob, got ${data === null ? "null" : typeof data}`);
    }
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const w = await this.#http.json<WireFileInfo>("PUT", this.#base, {
      query: { path },
      body,
      headers: { "Content-Type": "application/octet-stream" },
      long: true,
    });
    return toFileInfo(w);
  }

  /**
   * Reads a regular file's bytes. A download that breaks off midway rejects
   * with a `PandaStackError` of code `stream_error`.
   */
  async read(path: string): Promise<Uint8Array> {
    return this.#http.bytes("GET", this.#base, { query: { path } });
  }

  /** Reads a regular file as UTF-8 text. */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  /** Lists a directory's entries, sorted by name. */
  async list(path = "/home/user"): Promise<FileInfo[]> {
    const w = await this.#http.json<{ files: WireFileInfo[] | null }>("GET", `${this.#base}/list`, { query: { path } });
    return (w.files ?? []).map(toFileInfo);
  }

  /** Describes a file; a symlink is described itself, not its target. */
  async stat(path: string): Promise<FileInfo> {
    return toFileInfo(await this.#http.json<WireFileInfo>("GET", `${this.#base}/stat`, { query: { path } }));
  }

  /** Whether something exists at `path`; a sandbox that is gone throws `NotFoundError`. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
      // The same 404 says "no such sandbox": ask which it was (a sandbox
      // that is gone throws NotFoundError, as every other call on it does).
      await this.#http.json("GET", this.#sandbox);
      return false;
    }
  }

  /**
   * Deletes a file, a symlink or an empty directory. A non-empty directory
   * needs `{ recursive: true }`, otherwise it is a `ConflictError`.
   */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.#http.empty("DELETE", this.#base, {
      query: { path, recursive: opts.recursive ? "true" : undefined },
    });
  }

  /** Creates a directory and any missing parents, like `mkdir -p`. */
  async mkdir(path: string): Promise<FileInfo> {
    return toFileInfo(await this.#http.json<WireFileInfo>("POST", `${this.#base}/mkdir`, { query: { path } }));
  }

  /**
   * Watches the directory at `path` and resolves once the watch is live:
   * each change from then on is handed to `onEvent` (awaited, if it is
   * async), until `stop()`, `opts.signal`, the directory's removal (its own
   * event comes last) or a failure, a throwing `onEvent`'s included
   * (`onExit` and `wait()` tell). A watched sandbox is not suspended for
   * idleness.
   * A missing directory rejects with `NotFoundError`, a file with
   * `InvalidRequestError`.
   */
  async watchDir(path: string, onEvent: (ev: FileEvent) => unknown, opts: WatchOptions = {}): Promise<WatchHandle> {
    const abort = new AbortController();
    // The caller's signal ends the watch; a watch that ends otherwise lets
    // go of it (one long-lived signal serves many watches).
    const onAbort = () => abort.abort();
    const detach = () => opts.signal?.removeEventListener("abort", onAbort);
    if (opts.signal) {
      if (opts.signal.aborted) abort.abort();
      else opts.signal.addEventListener("abort", onAbort, { once: true });
    }
    const events = this.#http.ndjson("GET", `${this.#base}/watch`, {
      query: { path, recursive: opts.recursive ? "true" : undefined },
      signal: abort.signal,
      long: true,
    });
    let first: Awaited<ReturnType<typeof events.next>>;
    try {
      first = await events.next();
    } catch (err) {
      detach();
      throw err;
    }
    if (first.done || first.value.type !== "watching") {
      detach();
      abort.abort();
      if (!first.done && first.value.type === "error") throw streamError(first.value.error);
      throw new PandaStackError("the watch ended before it started", "stream_error");
    }
    const run = (async () => {
      try {
        for await (const ev of events) {
          if (ev.type === "error") throw streamError(ev.error);
          if (ev.type === "keepalive") continue;
          await onEvent(toFileEvent(ev)); // an async handler's failure ends the watch (onExit, wait())
        }
      } catch (err) {
        if (!abort.signal.aborted) throw err;
      } finally {
        detach();
      }
    })();
    return new WatchHandle(abort, run, opts.onExit);
  }

  /**
   * Moves or renames a file, a directory (with its contents) or a symlink
   * (itself), making missing parents of `newPath`. An existing `newPath` is
   * a `ConflictError` unless `{ overwrite: true }` (a file then replaces a
   * file, a directory an empty directory). Resolves to what was moved, at
   * its new path.
   */
  async rename(oldPath: string, newPath: string, opts: { overwrite?: boolean } = {}): Promise<FileInfo> {
    return toFileInfo(
      await this.#http.json<WireFileInfo>("POST", `${this.#base}/rename`, {
        query: { path: oldPath, to: newPath, overwrite: opts.overwrite ? "true" : undefined },
      }),
    );
  }
}
