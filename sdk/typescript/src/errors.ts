/**
 * Errors thrown by the SDK. Every error the server answers with has the shape
 * `{"error": {"code": "...", "message": "..."}}`; the SDK turns it into a
 * `PandaStackError` (or one of its subclasses) carrying that stable `code` and
 * the HTTP `status`. Switch on `instanceof` or on `.code`, never on the message.
 *
 * Note: a Python exception inside a code context is not thrown. It comes back
 * as `execution.error` (an {@link ExecutionError} in code.ts), because for an
 * agent a failing cell is a normal outcome it should read and fix.
 */

/** Base class of every error the SDK throws. */
export class PandaStackError extends Error {
  /**
   * The server's stable error code (`not_found`, `conflict`, ...), or one of
   * the SDK's own: `missing_api_key`, `connection_error`, `bad_response`,
   * `stream_error`.
   */
  readonly code: string;
  /** HTTP status of the answer; `undefined` when there was no answer. */
  readonly status: number | undefined;

  constructor(message: string, code: string, status?: number, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.status = status;
  }
}

/** 401 `unauthorized`: the API key is missing, unknown or revoked. */
export class AuthenticationError extends PandaStackError {}

/**
 * 403 `permission_denied`: the sandbox user may not read or write that file
 * (file operations run as the sandbox user, as its code does), or the
 * filesystem there is read-only.
 */
export class PermissionDeniedError extends PandaStackError {}

/** 404 `not_found`: no such sandbox, context, file, template or snapshot in your project. */
export class NotFoundError extends PandaStackError {}

/**
 * 409 `conflict` or `template_not_built`: the target's state forbids the
 * operation (a busy code context, a non-empty directory, a paused sandbox, a
 * template this server has not built).
 */
export class ConflictError extends PandaStackError {}

/** 400 `invalid_request` or `command_not_found`: the request itself is wrong. */
export class InvalidRequestError extends PandaStackError {}

/**
 * 422 `network_denied`: a network policy entry lies inside the platform deny
 * set (the host, private ranges, cloud metadata, ...); nothing changed.
 */
export class NetworkDeniedError extends InvalidRequestError {}

/**
 * 503 `sandbox_unavailable`: the sandbox's agent does not answer for now (it
 * is starting, or dying and not yet known to be stopped), the server is
 * shutting down, or its database cannot be reached (retry).
 */
export class SandboxUnavailableError extends PandaStackError {}

/**
 * 410 `sandbox_stopped`: the sandbox has stopped (killed, expired, out of
 * memory, ...; the message says which) and never runs again. No retry helps:
 * create a new sandbox.
 */
export class SandboxStoppedError extends PandaStackError {}

/** 504 `timeout`: an operation ran past its deadline on the server. */
export class TimeoutError extends PandaStackError {}

/** 409 `template_not_built`: build it with `pandastack template build NAME`. */
export class TemplateNotBuiltError extends ConflictError {}

/** 400 `command_not_found`: exec of a program that does not exist in the sandbox. */
export class CommandNotFoundError extends InvalidRequestError {}

/** 405 `method_not_allowed`: the path exists, the HTTP method does not. */
export class MethodNotAllowedError extends PandaStackError {}

/** 413 `payload_too_large`: a body over the server's limit, or the sandbox's disk is full. */
export class PayloadTooLargeError extends PandaStackError {}

/** 422 `snapshot_corrupt`: a snapshot's files are missing, truncated or altered. */
export class SnapshotCorruptError extends PandaStackError {}

/** 502 `port_unreachable`: nothing answers on the sandbox port a request was proxied to. */
export class PortUnreachableError extends PandaStackError {}

/** 507 `insufficient_storage`: the server's disk is full. */
export class InsufficientStorageError extends PandaStackError {}

/**
 * 503 `insufficient_memory`: the server's host is short of memory for another
 * running sandbox (a create, restore, fork, or the resume of a paused one),
 * and no quiet sandbox was left to suspend for it; nothing was started: retry
 * later, or pause or kill sandboxes.
 */
export class InsufficientMemoryError extends PandaStackError {}

/** 500 `internal`: a bug or a host failure on the server; the message is safe to show. */
export class InternalServerError extends PandaStackError {}

/** `connection_error`: the server could not be reached (no HTTP answer). */
export class APIConnectionError extends PandaStackError {}

/** Builds the typed error for a server error code. */
export function errorFromCode(code: string, message: string, status?: number): PandaStackError {
  const text = `${message} (${code}${status ? `, HTTP ${status}` : ""})`;
  switch (code) {
    case "unauthorized":
      return new AuthenticationError(text, code, status);
    case "permission_denied":
      return new PermissionDeniedError(text, code, status);
    case "not_found":
      return new NotFoundError(text, code, status);
    case "conflict":
      return new ConflictError(text, code, status);
    case "template_not_built":
      return new TemplateNotBuiltError(text, code, status);
    case "invalid_request":
      return new InvalidRequestError(text, code, status);
    case "command_not_found":
      return new CommandNotFoundError(text, code, status);
    case "method_not_allowed":
      return new MethodNotAllowedError(text, code, status);
    case "payload_too_large":
      return new PayloadTooLargeError(text, code, status);
    case "snapshot_corrupt":
      return new SnapshotCorruptError(text, code, status);
    case "port_unreachable":
      return new PortUnreachableError(text, code, status);
    case "insufficient_storage":
      return new InsufficientStorageError(text, code, status);
    case "insufficient_memory":
      return new InsufficientMemoryError(text, code, status);
    case "internal":
      return new InternalServerError(text, code, status);
    case "network_denied":
      return new NetworkDeniedError(text, code, status);
    case "sandbox_unavailable":
      return new SandboxUnavailableError(text, code, status);
    case "sandbox_stopped":
      return new SandboxStoppedError(text, code, status);
    case "timeout":
      return new TimeoutError(text, code, status);
    default:
      return new PandaStackError(text, code, status);
  }
}

/** Error codes implied by a status when a body carries no code (a proxy's page, say). */
export function codeForStatus(status: number): string {
  switch (status) {
    case 400:
      return "invalid_request";
    case 401:
      return "unauthorized";
    case 403:
      return "permission_denied";
    case 404:
      return "not_found";
    case 405:
      return "method_not_allowed";
    case 409:
      return "conflict";
    case 410:
      return "sandbox_stopped";
    case 413:
      return "payload_too_large";
    case 422:
      return "snapshot_corrupt";
    case 503:
      return "sandbox_unavailable";
    case 504:
      return "timeout";
    case 507:
      return "insufficient_storage";
    default:
      return status >= 500 ? "internal" : "http_error";
  }
}
