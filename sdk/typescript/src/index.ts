/**
 * @pandastack/sdk — the TypeScript SDK of PandaStack, a self-hostable sandbox
 * for AI agents. Configure it with PANDASTACK_API_KEY (required unless passed
 * as `apiKey`) and PANDASTACK_API (default http://localhost:8080).
 *
 * @example
 * ```ts
 * import { Sandbox } from "@pandastack/sdk";
 *
 * const sandbox = await Sandbox.create({ template: "code-interpreter", ttlSeconds: 600 });
 * const ctx = await sandbox.createCodeContext({ language: "python" });
 * const ex = await ctx.runCode("import math; math.pi");
 * console.log(ex.text); // 3.141592653589793
 * await sandbox.kill();
 * ```
 *
 * @packageDocumentation
 */

export { Terminal, type TerminalOptions, type WebSocketConstructor, type WebSocketLike } from "./terminal.js";
export {
  Commands,
  Sandbox,
  Snapshot,
  type ExecOptions,
  type ExecResult,
  type ForkOptions,
  type EgressEntry,
  type NetworkPolicy,
  type SandboxCreateOptions,
  type SandboxInfo,
  type SandboxListOptions,
  type SandboxRunCodeOptions,
  type SandboxState,
  type SandboxStats,
  type SnapshotInfo,
  type TemplateInfo,
} from "./sandbox.js";
export {
  CommandHandle,
  type OutputChunk,
  type ProcessesKilled,
  type ProcessInfo,
  type WaitOptions,
} from "./commands.js";
export {
  CodeContext,
  ExecutionError,
  type Chart,
  type ChartElement,
  type Table,
  type CreateCodeContextOptions,
  type Execution,
  type Language,
  type Result,
  type RunCodeOptions,
} from "./code.js";
export { Files, WatchHandle, type FileData, type FileEvent, type FileInfo, type WatchOptions } from "./files.js";
export { DEFAULT_API_URL, type ConnectionOptions } from "./http.js";
export {
  APIConnectionError,
  AuthenticationError,
  CommandNotFoundError,
  ConflictError,
  InsufficientStorageError,
  InsufficientMemoryError,
  InternalServerError,
  InvalidRequestError,
  MethodNotAllowedError,
  NetworkDeniedError,
  NotFoundError,
  PermissionDeniedError,
  PandaStackError,
  PayloadTooLargeError,
  PortUnreachableError,
  SandboxUnavailableError,
  SandboxStoppedError,
  SnapshotCorruptError,
  TemplateNotBuiltError,
  TimeoutError,
} from "./errors.js";
