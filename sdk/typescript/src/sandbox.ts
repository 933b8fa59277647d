/**
 * Sandboxes: create, connect, list, exec, files, code, snapshots, fork,
 * pause/resume, kill.
 */

import { Terminal, type TerminalOptions } from "./terminal.js";
import {
  CodeContext,
  type CreateCodeContextOptions,
  type Execution,
  type Language,
  type RunCodeOptions,
  type WireContext,
  runCode,
} from "./code.js";
import {
  CommandHandle,
  type ExecResult,
  type ProcessesKilled,
  type ProcessInfo,
  type WireExecResult,
  type WireProcess,
  collectExec,
  connectProcess,
  listProcesses,
  processesPath,
  toExecResult,
  toProcessInfo,
} from "./commands.js";
import {
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PandaStackError,
  SandboxStoppedError,
  SandboxUnavailableError,
} from "./errors.js";
import { Files } from "./files.js";
import { type ConnectionOptions, HttpClient } from "./http.js";

/** A template the server has built (`Sandbox.listTemplates()`). */
export interface TemplateInfo {
  name: string;
  description: string;
  hash: string;
  sizeBytes: number;
  cpu: number;
  memoryMb: number;
  /** Default size in MiB of a sandbox's own disk (0: writes stay in memory). */
  diskMb: number;
  builtAt: Date;
  buildSeconds: number;
  /** Creates restore a warm snapshot (the default Python context already up). */
  warm: boolean;
  /** Why its warm-up failed on the server, when it did (its creates boot cold). */
  warmError?: string;
  /** Sandboxes restored ahead of creates; undefined when the template has no pool. */
  pool?: { ready: number; size: number; pssBytes: number };
}

interface WireTemplate {
  name: string;
  description?: string;
  hash: string;
  size_bytes: number;
  cpu: number;
  memory_mb: number;
  disk_mb?: number;
  built_at: string;
  build_seconds?: number;
  warm?: boolean;
  warm_error?: string;
  pool?: { ready: number; size: number; pss_bytes?: number };
}

/** What a sandbox uses now (`sandbox.stats()`). */
export interface SandboxStats {
  /** Host memory charged to the sandbox: what its memory limit counts. */
  memoryBytes: number;
  memoryLimitBytes: number;
  /** CPU time since it started, or was last resumed or restored. */
  cpuSeconds: number;
  /** CPUs it may use. */
  cpuLimit: number;
  sampledAt: Date;
  /**
   * What is used of its disk, as `df /` shows it inside, and the disk's size
   * (its `disk_mb`); absent while it is paused, or when its agent is of a
   * build that cannot say.
   */
  diskBytes?: number;
  diskLimitBytes?: number;
}

/** `starting`, `running`, `paused` or `stopped` (more may come). */
export type SandboxState = "starting" | "running" | "paused" | "stopped" | (string & {});

/** A sandbox as the server describes it. */
export interface SandboxInfo {
  /** `sbx_` and 16 random characters. */
  id: string;
  /** Name of the template it was created from. */
  template: string;
  state: SandboxState;
  /** Your labels; `{}` when none were given. */
  metadata: Record<string, string>;
  /** CPUs it may use. */
  cpu: number;
  /** Memory limit in MiB. */
  memoryMb: number;
  createdAt: Date;
  /** When the server stops it unless `setTtl` extends it. */
  expiresAt: Date;
  /** Present once stopped. */
  stoppedAt?: Date;
  /** Present once stopped: `expired`, `killed`, `died`, `out_of_memory`, `pids_limit`, `lost` or `start_failed`. */
  stopReason?: string;
  /**
   * Seconds idle (nothing running, no request, CPU quiet) after which the
   * server suspends it to disk; the next request resumes it. 0: never.
   */
  idleTimeoutSeconds: number;
  /**
   * While paused: `idle` when the server suspended it for idleness, `memory`
   * when it did so because its host ran short of memory (either way any
   * request resumes it).
   */
  pauseReason?: string;
  /** Whether any request resumes it while paused (else they answer `ConflictError`). */
  autoResume: boolean;
  /** Its egress policy; undefined when the server runs without networking. */
  network?: NetworkPolicy;
}

/** Options of `Sandbox.create`. Every field is optional. */
export interface SandboxCreateOptions extends ConnectionOptions {
  /**
   * Name of a built template (see `pandastack template ls`). Default: the
   * server's, `base`. Use `code-interpreter` for code contexts with
   * IPython, pandas, matplotlib and plotly.
   */
  template?: string;
  /** Seconds until the server stops it (server default 300, at most its --max-ttl). */
  ttlSeconds?: number;
  /** Labels to find it again with `Sandbox.list({ metadata })`. */
  metadata?: Record<string, string>;
  /** Environment variables of every command and kernel in it. */
  env?: Record<string, string>;
  /**
   * Restore this snapshot (`snap_...`) instead of booting a template: the
   * variables of every code context, files and installed packages come back.
   * With a snapshot only `ttlSeconds`, `idleTimeoutSeconds`, `metadata`,
   * `autoResume` and `network` may be given; `template`, `cpu`, `memoryMb`,
   * `diskMb` and `env` are the snapshot's (giving them is an
   * `InvalidRequestError`).
   */
  snapshotId?: string;
  /**
   * While paused, any request resumes the sandbox instead of failing with a
   * `ConflictError`. Default false.
   */
  autoResume?: boolean;
  /**
   * Suspend it to disk after this many idle seconds; any later request
   * resumes it transparently. 0: never. Default: the server's (300).
   */
  idleTimeoutSeconds?: number;
  /** Egress policy; default the server's (internet unless configured otherwise). */
  network?: NetworkPolicy;
  /** CPUs; default the template's. */
  cpu?: number;
  /** Memory limit in MiB; default the template's. */
  memoryMb?: number;
  /** The sandbox's disk (its writable layer) in MiB; default the template's. */
  diskMb?: number;
}

/** Options of `Sandbox.list`. */
export interface SandboxListOptions extends ConnectionOptions {
  /** Only sandboxes whose metadata has every one of these pairs. */
  metadata?: Record<string, string>;
  /** States to include, or `all`. Default: starting, running and paused ones. */
  state?: SandboxState[] | "all";
  /** How many sandboxes each request asks the server for (1 to 1000; default 500): the list is read a page at a time. */
  pageSize?: number;
}

/** Options of `sandbox.exec`. */
export interface ExecOptions {
  /** Seconds before the command's process tree is killed (server default 60). */
  timeout?: number;
  /** Environment variables added to the sandbox's for this command. */
  env?: Record<string, string>;
  /** Working directory; relative to `/home/user`, the default. It must exist. */
  cwd?: string;
  /**
   * Text written to the command's standard input, which is then closed; a
   * background command's input stays open for its handle's `sendStdin` (`{ eof: true }`
   * closes it).
   */
  stdin?: string;
  /**
   * Called with each chunk of standard output as it is produced. Giving
   * either callback streams the command; callbacks run one at a time in the
   * order output was produced (a returned promise is awaited), and nothing
   * is truncated.
   */
  onStdout?: (data: string) => unknown;
  /** Called with each chunk of standard error as it is produced. */
  onStderr?: (data: string) => unknown;
  /** Aborts the request, which kills the command. */
  signal?: AbortSignal;
  /**
   * Start the command and resolve at once with a `CommandHandle`; its
   * output is kept by the server. No default timeout then.
   */
  background?: boolean;
}

export type { ExecResult } from "./commands.js";

/** Options of `sandbox.runCode`. */
export interface SandboxRunCodeOptions extends RunCodeOptions {
  /**
   * Language of the sandbox's default context to run in; default `python`.
   * With `context`, it must be that context's language (else a 400).
   */
  language?: Language;
  /** Run in this context instead of the default one. */
  context?: CodeContext | string;
}

/** A snapshot as the server describes it. */
export interface SnapshotInfo {
  /** `snap_...` */
  id: string;
  /** The sandbox it was taken of. */
  sandboxId: string;
  template: string;
  /** Disk used by the snapshot's image. */
  sizeBytes: number;
  metadata: Record<string, string>;
  createdAt: Date;
  /** CPUs and memory (MiB) of sandboxes restored from it. */
  cpu: number;
  memoryMb: number;
  /**
   * The egress policy a restore applies unless it gives one; undefined on a
   * server without networking, and for snapshots taken before it was kept.
   */
  network?: NetworkPolicy;
}

/** Options of `sandbox.fork`. */
export interface ForkOptions {
  /** TTL of each child; default the server's default TTL. */
  ttlSeconds?: number;
  /** Metadata of each child; default the parent's. */
  metadata?: Record<string, string>;
  /** Egress policy of each child, in force from its first instant; default the parent's. */
  network?: NetworkPolicy;
}

interface WireSandbox {
  id: string;
  template: string;
  state: string;
  metadata?: Record<string, string> | null;
  cpu: number;
  memory_mb: number;
  created_at: string;
  expires_at: string;
  stopped_at?: string;
  stop_reason?: string;
  idle_timeout_seconds?: number;
  pause_reason?: string;
  auto_resume?: boolean;
  network?: WireNetworkPolicy;
}

interface WireNetworkPolicy {
  allow_internet_access: boolean;
  allow_out: string[];
  deny_out: string[];
}

/**
 * A sandbox's egress policy. `allowOut` (IPs, CIDRs, domains, `*.domain`)
 * wins over `denyOut` (IPs, CIDRs); without `allowInternetAccess: true` only
 * `allowOut` is reachable (a `denyOut` needs it: it carves out of the internet). A platform deny set (the host, private ranges,
 * cloud metadata, other sandboxes) always applies.
 */
export interface NetworkPolicy {
  allowInternetAccess?: boolean;
  allowOut?: string[];
  denyOut?: string[];
}

/** One line of a sandbox's egress log. */
export interface EgressEntry {
  time: string;
  kind: "dns" | "tcp" | "udp";
  address?: string;
  port?: number;
  domain?: string;
  bytes_out: number;
  bytes_in: number;
  allowed: boolean;
  rule: string;
}

function wireNetwork(p: NetworkPolicy): WireNetworkPolicy {
  // Omitted means no internet, as in the API: a policy of only `allowOut` reaches only those.
  return { allow_internet_access: p.allowInternetAccess ?? false, allow_out: p.allowOut ?? [], deny_out: p.denyOut ?? [] };
}

interface WireSnapshot {
  id: string;
  sandbox_id: string;
  template: string;
  size_bytes: number;
  created_at: string;
  metadata?: Record<string, string> | null;
  cpu?: number;
  memory_mb?: number;
  network?: WireNetworkPolicy;
}

function toInfo(w: WireSandbox): SandboxInfo {
  const info: SandboxInfo = {
    id: w.id,
    template: w.template,
    state: w.state,
    metadata: w.metadata ?? {},
    cpu: w.cpu,
    memoryMb: w.memory_mb,
    createdAt: new Date(w.created_at),
    expiresAt: new Date(w.expires_at),
    idleTimeoutSeconds: w.idle_timeout_seconds ?? 0,
    autoResume: w.auto_resume ?? false,
  };
  if (w.stopped_at) info.stoppedAt = new Date(w.stopped_at);
  if (w.stop_reason) info.stopReason = w.stop_reason;
  if (w.pause_reason) info.pauseReason = w.pause_reason;
  if (w.network) {
    info.network = toNetworkPolicy(w.network);
  }
  return info;
}

function toNetworkPolicy(w: WireNetworkPolicy): NetworkPolicy {
  return { allowInternetAccess: w.allow_internet_access, allowOut: w.allow_out ?? [], denyOut: w.deny_out ?? [] };
}

function toSnapshotInfo(w: WireSnapshot): SnapshotInfo {
  return {
    id: w.id,
    sandboxId: w.sandbox_id,
    template: w.template,
    sizeBytes: w.size_bytes,
    metadata: w.metadata ?? {},
    createdAt: new Date(w.created_at),
    cpu: w.cpu ?? 0,
    memoryMb: w.memory_mb ?? 0,
    network: w.network ? toNetworkPolicy(w.network) : undefined,
  };
}

/**
 * An isolated gVisor sandbox on a PandaStack server. Make one with
 * `Sandbox.create()`, or reattach with `Sandbox.connect(id)`. Its
 * description fields (`state`, `expiresAt`, ...) are as of the last answer
 * the SDK got about it; `getInfo()` refreshes them.
 */
export class Sandbox implements SandboxInfo {
  readonly id: string;
  template!: string;
  state!: SandboxState;
  metadata!: Record<string, string>;
  cpu!: number;
  memoryMb!: number;
  createdAt!: Date;
  expiresAt!: Date;
  stoppedAt?: Date;
  stopReason?: string;
  idleTimeoutSeconds!: number;
  pauseReason?: string;
  autoResume!: boolean;
  /** Its egress policy, as of the last answer; undefined when the server runs without networking. */
  network?: NetworkPolicy;
  /** The sandbox's files. */
  readonly files: Files;
  readonly #http: HttpClient;

  private constructor(http: HttpClient, w: WireSandbox) {
    this.#http = http;
    this.id = w.id;
    this.files = new Files(http, w.id);
    this.#update(w);
  }

  #update(w: WireSandbox): void {
    const info = toInfo(w);
    this.template = info.template;
    this.state = info.state;
    this.metadata = info.metadata;
    this.cpu = info.cpu;
    this.memoryMb = info.memoryMb;
    this.createdAt = info.createdAt;
    this.expiresAt = info.expiresAt;
    this.stoppedAt = info.stoppedAt;
    this.stopReason = info.stopReason;
    this.idleTimeoutSeconds = info.idleTimeoutSeconds;
    this.pauseReason = info.pauseReason;
    this.autoResume = info.autoResume;
    this.network = info.network;
  }

  #path(sub = ""): string {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}${sub}`;
  }

  /**
   * Creates a sandbox and resolves once it runs. Reads PANDASTACK_API_KEY and
   * PANDASTACK_API unless `apiKey` / `apiUrl` are given.
   */
  static async create(opts: SandboxCreateOptions = {}): Promise<Sandbox> {
    const http = HttpClient.resolve(opts);
    const body: Record<string, unknown> = {};
    if (opts.template !== undefined) body.template = opts.template;
    if (opts.ttlSeconds !== undefined) body.ttl_seconds = opts.ttlSeconds;
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.snapshotId !== undefined) body.snapshot_id = opts.snapshotId;
    if (opts.cpu !== undefined) body.cpu = opts.cpu;
    if (opts.memoryMb !== undefined) body.memory_mb = opts.memoryMb;
    if (opts.diskMb !== undefined) body.disk_mb = opts.diskMb;
    if (opts.autoResume !== undefined) body.auto_resume = opts.autoResume;
    if (opts.idleTimeoutSeconds !== undefined) body.idle_timeout_seconds = opts.idleTimeoutSeconds;
    if (opts.network !== undefined) body.network = wireNetwork(opts.network);
    return new Sandbox(http, await http.json<WireSandbox>("POST", "/v1/sandboxes", { json: body }));
  }

  /** Reattaches to an existing sandbox by id; `NotFoundError` if there is none. */
  static async connect(id: string, opts: ConnectionOptions = {}): Promise<Sandbox> {
    const http = HttpClient.resolve(opts);
    return new Sandbox(http, await http.json<WireSandbox>("GET", `/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  /** The templates the server has built and can create sandboxes from. */
  static async listTemplates(opts: ConnectionOptions = {}): Promise<TemplateInfo[]> {
    const http = HttpClient.resolve(opts);
    const w = await http.json<{ templates: WireTemplate[] | null }>("GET", "/v1/templates");
    return (w.templates ?? []).map((t) => ({
      name: t.name,
      description: t.description ?? "",
      hash: t.hash,
      sizeBytes: t.size_bytes,
      cpu: t.cpu,
      memoryMb: t.memory_mb,
      diskMb: t.disk_mb ?? 0,
      builtAt: new Date(t.built_at),
      buildSeconds: t.build_seconds ?? 0,
      warm: Boolean(t.warm),
      warmError: t.warm_error || undefined,
      pool: t.pool ? { ready: t.pool.ready, size: t.pool.size, pssBytes: t.pool.pss_bytes ?? 0 } : undefined,
    }));
  }

  /** Lists your project's sandboxes, oldest first, optionally filtered by metadata and state (read a page at a time). */
  static async list(opts: SandboxListOptions = {}): Promise<Sandbox[]> {
    const http = HttpClient.resolve(opts);
    const query: Record<string, string> = { limit: String(opts.pageSize ?? 500) };
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    if (opts.state !== undefined) query.state = opts.state === "all" ? "all" : opts.state.join(",");
    const out: Sandbox[] = [];
    type Page = { sandboxes: WireSandbox[] | null; next?: string };
    for (;;) {
      let w: Page;
      try {
        w = await http.json<Page>("GET", "/v1/sandboxes", { query });
      } catch (err) {
        // A server from before pages refuses limit, and lists everything at once.
        const old = query.after === undefined && err instanceof PandaStackError && err.code === "invalid_request" && err.message.includes('"limit"');
        if (!old) throw err;
        delete query.limit;
        w = await http.json<Page>("GET", "/v1/sandboxes", { query });
      }
      for (const s of w.sandboxes ?? []) out.push(new Sandbox(http, s));
      if (!w.next) return out;
      if (w.next === query.after || !w.sandboxes?.length) {
        throw new PandaStackError(`the server answered next ${JSON.stringify(w.next)} to the page after ${JSON.stringify(query.after ?? null)}, which would never end`, "internal");
      }
      query.after = w.next;
    }
  }

  /** Fetches the sandbox's current description (and updates this object). */
  async getInfo(): Promise<SandboxInfo> {
    const w = await this.#http.json<WireSandbox>("GET", this.#path());
    this.#update(w);
    return toInfo(w);
  }

  /** Makes the sandbox expire `seconds` from now (not from its creation). */
  async setTtl(seconds: number): Promise<void> {
    this.#update(await this.#http.json<WireSandbox>("PATCH", this.#path(), { json: { ttl_seconds: seconds } }));
  }

  /** Sets the seconds idle after which the server suspends it (0: never). */
  async setIdleTimeout(seconds: number): Promise<void> {
    this.#update(await this.#http.json<WireSandbox>("PATCH", this.#path(), { json: { idle_timeout_seconds: seconds } }));
  }

  /**
   * Replaces the sandbox's egress policy; it takes effect at once. A rejected
   * policy (`InvalidRequestError` naming the entry, `NetworkDeniedError` for
   * the platform deny set) changes nothing.
   */
  async setNetwork(policy: NetworkPolicy): Promise<void> {
    this.#update(await this.#http.json<WireSandbox>("PUT", this.#path("/network"), { json: wireNetwork(policy) }));
  }

  /**
   * The memory, CPU time and disk the sandbox uses now, and its limits. A paused
   * sandbox uses none and reports zeros (the look does not wake it); a
   * stopped one is a `SandboxStoppedError`.
   */
  async stats(): Promise<SandboxStats> {
    const w = await this.#http.json<{
      memory_bytes: number;
      memory_limit_bytes: number;
      cpu_seconds: number;
      cpu_limit: number;
      sampled_at: string;
      disk_bytes?: number;
      disk_limit_bytes?: number;
    }>("GET", this.#path("/stats"));
    const st: SandboxStats = {
      memoryBytes: w.memory_bytes,
      memoryLimitBytes: w.memory_limit_bytes,
      cpuSeconds: w.cpu_seconds,
      cpuLimit: w.cpu_limit,
      sampledAt: new Date(w.sampled_at),
    };
    if (w.disk_bytes !== undefined && w.disk_limit_bytes !== undefined) {
      st.diskBytes = w.disk_bytes;
      st.diskLimitBytes = w.disk_limit_bytes;
    }
    return st;
  }

  /** The egress log, oldest first: DNS answers, connections (through NAT or the domain proxy) and connects the firewall refused. */
  async networkLog(): Promise<EgressEntry[]> {
    const w = await this.#http.json<{ entries: EgressEntry[] | null }>("GET", this.#path("/network/log"));
    return w.entries ?? [];
  }

  /**
   * The URL of a server listening on `port` (on 0.0.0.0) inside the sandbox,
   * through the server's port proxy. By default it carries an expiring token
   * and opens in a browser with no header; with `{ token: false }` requests
   * to it need the API key.
   */
  async getUrl(port: number, opts: { token?: boolean; ttlSeconds?: number } = {}): Promise<string> {
    const path = this.#path(`/ports/${port}/`);
    if (opts.token === false) return this.#http.apiUrl + path;
    const body: Record<string, unknown> = {};
    if (opts.ttlSeconds !== undefined) body.ttl_seconds = opts.ttlSeconds;
    return (await this.#http.json<{ url: string }>("POST", path + "token", { json: body })).url;
  }

  /**
   * Opens an interactive shell on a real terminal in the sandbox (see
   * `Terminal`). Needs a WebSocket: the global one, or `opts.WebSocket`
   * (e.g. the `ws` package's on Node 20).
   */
  async terminal(opts: TerminalOptions = {}): Promise<Terminal> {
    // A refused WebSocket tells no reason: sizes are checked here, as the
    // server checks them, to say what is wrong.
    for (const [name, v] of [["cols", opts.cols], ["rows", opts.rows]] as const) {
      if (v !== undefined && !(Number.isInteger(v) && v >= 1 && v <= 1000)) {
        throw new InvalidRequestError(`${name} must be a whole number from 1 to 1000, got ${v}`, "invalid_request", 400);
      }
    }
    try {
      return await Terminal.open(this.#http.apiUrl, this.#http.apiKey, this.id, opts);
    } catch (err) {
      if (!(err instanceof PandaStackError) || err.code !== "terminal_refused") throw err;
      // A WebSocket that failed to open tells no HTTP status: the REST API
      // says why, as the typed error any other call would get (no such
      // sandbox, a wrong key), or the sandbox has stopped.
      const w = await this.#http.json<WireSandbox>("GET", this.#path());
      if (w.state === "stopped") {
        throw new SandboxStoppedError(
          `sandbox ${this.id} has stopped${w.stop_reason ? ` (${w.stop_reason})` : ""}: it has no terminal (sandbox_stopped, HTTP 410)`,
          "sandbox_stopped",
          410,
        );
      }
      // Paused as asked, without autoResume: a request does not wake it (one
      // suspended for idleness or memory wakes, and the refusal was another).
      if (w.state === "paused" && !w.auto_resume && !w.pause_reason) {
        throw new ConflictError(`sandbox ${this.id} is paused; resume it first (conflict, HTTP 409)`, "conflict", 409);
      }
      if (w.state === "starting") {
        throw new SandboxUnavailableError(`sandbox ${this.id} is still starting; try again in a moment`, "sandbox_unavailable", 503);
      }
      throw err;
    }
  }

  /**
   * Stops the sandbox and deletes it; a later `connect` is a `NotFoundError`.
   * Killing a sandbox that is already gone is not an error.
   */
  async kill(): Promise<void> {
    try {
      await this.#http.empty("DELETE", this.#path());
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
    this.state = "stopped";
    this.stopReason = "killed";
  }

  /**
   * Runs one command as the user `user`: a string runs through `bash -c`,
   * an array runs that program with those arguments, without a shell.
   * There is no state between calls; for a notebook-like kernel use
   * `createCodeContext()`.
   */
  async exec(cmd: string | string[], opts: ExecOptions & { background: true }): Promise<CommandHandle>;
  async exec(cmd: string | string[], opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult | CommandHandle> {
    const body: Record<string, unknown> = typeof cmd === "string" ? { cmd } : { argv: cmd };
    if (opts.timeout !== undefined) body.timeout_seconds = opts.timeout;
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    if (opts.stdin !== undefined) body.stdin = opts.stdin;
    const path = this.#path("/exec");
    if (opts.background) {
      if (opts.onStdout || opts.onStderr) {
        throw new TypeError("onStdout/onStderr go to CommandHandle.wait() for a background command");
      }
      body.background = true;
      const w = await this.#http.json<WireProcess>("POST", path, { json: body, signal: opts.signal });
      return new CommandHandle(this.#http, this.id, toProcessInfo(w));
    }
    if (!opts.onStdout && !opts.onStderr) {
      const w = await this.#http.json<WireExecResult>("POST", path, { json: body, signal: opts.signal, long: true });
      return toExecResult(w, w.stdout ?? "", w.stderr ?? "");
    }
    return collectExec(this.#http.execEvents("POST", path, { json: body, signal: opts.signal, long: true }), opts, `exec in ${this.id}`);
  }

  /** Background processes, oldest first: the running ones and the last 64 that ended. */
  listProcesses(): Promise<ProcessInfo[]> {
    return listProcesses(this.#http, this.id);
  }

  /** A handle on background process `pid`; `NotFoundError` if there is none. */
  connectProcess(pid: number): Promise<CommandHandle> {
    return connectProcess(this.#http, this.id, pid);
  }

  /** SIGKILLs background process `pid` and everything it started. */
  async killProcess(pid: number): Promise<void> {
    await this.#http.empty("POST", processesPath(this.id, `/${pid}/kill`));
  }

  /**
   * SIGKILLs every process of the sandbox user but the code contexts'
   * kernels, which keep their state: commands, background processes,
   * terminals and what cells started (a fork bomb too; it cannot fork its
   * way out). Processes run as root are left. The way out of a sandbox
   * whose process table a runaway filled.
   */
  async killAllProcesses(): Promise<ProcessesKilled> {
    const w = await this.#http.json<{ killed?: number; remaining?: number }>("POST", processesPath(this.id, "/kill"));
    return { killed: w.killed ?? 0, remaining: w.remaining ?? 0 };
  }

  /**
   * E2B's names for commands: `commands.run(cmd, opts)` is `exec`, and
   * `list`, `kill`, `sendStdin`, `connect` act on background processes.
   * Unlike E2B's, `run` does not throw on a non-zero exit.
   */
  get commands(): Commands {
    return new Commands(this);
  }

  /** Alias of `setTtl`, under the name E2B's SDK uses. */
  setTimeout(seconds: number): Promise<void> {
    return this.setTtl(seconds);
  }

  /** Starts a code context: a persistent Jupyter kernel in this sandbox. */
  async createCodeContext(opts: CreateCodeContextOptions = {}): Promise<CodeContext> {
    const body: Record<string, unknown> = {};
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.autoRestart !== undefined) body.auto_restart = opts.autoRestart;
    const w = await this.#http.json<WireContext>("POST", this.#path("/contexts"), { json: body });
    return new CodeContext(this.#http, this.id, w);
  }

  /** The sandbox's code contexts, including default ones `runCode` made. */
  async listCodeContexts(): Promise<CodeContext[]> {
    const w = await this.#http.json<{ contexts: WireContext[] | null }>("GET", this.#path("/contexts"));
    return (w.contexts ?? []).map((c) => new CodeContext(this.#http, this.id, c));
  }

  /**
   * Runs code in the sandbox's default context of `language` (created on
   * first use and kept: state persists between calls), or in `context`.
   */
  runCode(code: string, opts: SandboxRunCodeOptions = {}): Promise<Execution> {
    const body: Record<string, unknown> = { code };
    if (opts.context !== undefined) {
      body.context_id = typeof opts.context === "string" ? opts.context : opts.context.id;
    }
    // With a context too: the server refuses a context of another language.
    if (opts.language !== undefined) body.language = opts.language;
    return runCode(this.#http, this.#path("/run_code"), body, opts);
  }

  /**
   * Snapshots the sandbox — memory, processes (kernels with their variables)
   * and files — and returns the snapshot's id. The sandbox keeps running;
   * a paused one stays paused. `Sandbox.create({ snapshotId })` brings the
   * state back. While an exec or
   * a run is in progress this is a `ConflictError`: snapshots never wait.
   */
  async snapshot(opts: { metadata?: Record<string, string> } = {}): Promise<string> {
    const w = await this.#http.json<WireSnapshot>("POST", this.#path("/snapshots"), {
      json: opts.metadata ? { metadata: opts.metadata } : {},
    });
    return w.id;
  }

  /**
   * Makes `count` independent copies of this sandbox as it is now (kernels
   * and files included; 1 to the server's maximum, 16 by default); each
   * lives on separately. Like `snapshot`, a `ConflictError` while an exec or
   * a run is in progress. A paused sandbox (or one suspended for idleness)
   * stays paused: the copies start from its paused image.
   */
  async fork(count = 1, opts: ForkOptions = {}): Promise<Sandbox[]> {
    const body: Record<string, unknown> = { count };
    if (opts.ttlSeconds !== undefined) body.ttl_seconds = opts.ttlSeconds;
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    if (opts.network !== undefined) body.network = wireNetwork(opts.network);
    const w = await this.#http.json<{ sandboxes: WireSandbox[] | null }>("POST", this.#path("/fork"), { json: body });
    return (w.sandboxes ?? []).map((s) => new Sandbox(this.#http, s));
  }

  /**
   * Checkpoints the sandbox to disk and frees its memory and CPU (state
   * `paused`). Its TTL keeps counting. Until `resume()`, requests to it are a
   * `ConflictError`, unless it was created with `autoResume`.
   */
  async pause(): Promise<void> {
    await this.#stateChange("/pause");
  }

  /** Brings a paused sandbox back with everything in place. */
  async resume(): Promise<void> {
    await this.#stateChange("/resume");
  }

  async #stateChange(sub: string): Promise<void> {
    this.#update(await this.#http.json<WireSandbox>("POST", this.#path(sub)));
  }
}

/** Snapshots of your project. Take one with `sandbox.snapshot()`. */
export class Snapshot {
  private constructor() {}

  /** Lists snapshots, oldest first, optionally only those whose metadata has every given pair. */
  static async list(opts: ConnectionOptions & { metadata?: Record<string, string> } = {}): Promise<SnapshotInfo[]> {
    const http = HttpClient.resolve(opts);
    const query: Record<string, string> = {};
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query[`metadata.${k}`] = v;
    const w = await http.json<{ snapshots: WireSnapshot[] | null }>("GET", "/v1/snapshots", { query });
    return (w.snapshots ?? []).map(toSnapshotInfo);
  }

  /** Describes one snapshot; `NotFoundError` if there is none. */
  static async get(id: string, opts: ConnectionOptions = {}): Promise<SnapshotInfo> {
    const http = HttpClient.resolve(opts);
    return toSnapshotInfo(await http.json<WireSnapshot>("GET", `/v1/snapshots/${encodeURIComponent(id)}`));
  }

  /** Deletes a snapshot and its files. */
  static async delete(id: string, opts: ConnectionOptions = {}): Promise<void> {
    const http = HttpClient.resolve(opts);
    await http.empty("DELETE", `/v1/snapshots/${encodeURIComponent(id)}`);
  }
}

/** `sandbox.commands`: E2B's names, as aliases of the sandbox's own methods. */
export class Commands {
  readonly #sb: Sandbox;

  /** @internal */
  constructor(sb: Sandbox) {
    this.#sb = sb;
  }

  /** Alias of `sandbox.exec`. */
  run(cmd: string | string[], opts: ExecOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: ExecOptions & { background?: false }): Promise<ExecResult>;
  run(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult | CommandHandle> {
    return opts.background
      ? this.#sb.exec(cmd, { ...opts, background: true })
      : this.#sb.exec(cmd, { ...opts, background: false });
  }

  /** Alias of `sandbox.listProcesses`. */
  list(): Promise<ProcessInfo[]> {
    return this.#sb.listProcesses();
  }

  /** Alias of `sandbox.killProcess`. */
  kill(pid: number): Promise<void> {
    return this.#sb.killProcess(pid);
  }

  /** Alias of `sandbox.killAllProcesses`. */
  killAll(): Promise<ProcessesKilled> {
    return this.#sb.killAllProcesses();
  }

  /** Writes to background process `pid`'s standard input. */
  async sendStdin(pid: number, data: string): Promise<void> {
    await (await this.#sb.connectProcess(pid)).sendStdin(data);
  }

  /** Alias of `sandbox.connectProcess`. */
  connect(pid: number): Promise<CommandHandle> {
    return this.#sb.connectProcess(pid);
  }
}
