"""Typed errors of the PandaStack SDK.

Every error the server sends has the shape ``{"error": {"code", "message"}}``
with a stable ``code``. The SDK raises one exception class per code family,
all derived from :class:`PandaStackError`, so callers can catch broadly or
narrowly::

    try:
        sandbox = Sandbox.connect("sbx_...")
    except NotFoundError:
        ...
    except PandaStackError as e:
        print(e.code, e.status, e.message)

An exception *inside* the code you run in a code context is not raised: it
is reported as ``Execution.error`` (see :class:`pandastack.ExecutionError`).
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

__all__ = [
    "PandaStackError",
    "ConfigurationError",
    "APIConnectionError",
    "InvalidRequestError",
    "CommandNotFoundError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "TemplateNotBuiltError",
    "PayloadTooLargeError",
    "InternalServerError",
    "SandboxError",
    "SandboxUnavailableError",
    "SandboxStoppedError",
    "SnapshotCorruptError",
    "InsufficientStorageError",
    "InsufficientMemoryError",
    "TimeoutError",
    "StreamError",
    "error_from_response",
]


class PandaStackError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the server's stable error code (``"not_found"``,
            ``"sandbox_unavailable"``, ...), or an SDK code for errors found
            on this side (``"missing_api_key"``, ``"connection_error"``,
            ``"client_timeout"``, ``"stream_error"``).
        status: the HTTP status of the answer, or ``None`` when there was no
            answer (connection failures, configuration errors) or the error
            arrived inside a stream that had already started.
        message: a human-readable explanation, often with a hint at the fix.
    """

    def __init__(self, message: str, *, code: str = "error", status: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message

    def __str__(self) -> str:
        where = f"{self.code}, HTTP {self.status}" if self.status else self.code
        return f"{self.message} ({where})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class ConfigurationError(PandaStackError, ValueError):
    """The SDK is not configured: typically ``PANDASTACK_API_KEY`` is not set."""


class APIConnectionError(PandaStackError, ConnectionError):
    """The server could not be reached (wrong ``PANDASTACK_API``, server down)."""


class InvalidRequestError(PandaStackError, ValueError):
    """HTTP 400 ``invalid_request``: a malformed request or out-of-range value."""


class CommandNotFoundError(InvalidRequestError):
    """HTTP 400 ``command_not_found``: exec of an argv whose program is missing."""


class AuthenticationError(PandaStackError):
    """HTTP 401 ``unauthorized``: the API key is missing, unknown or revoked."""


class PermissionDeniedError(PandaStackError, builtins.PermissionError):
    """HTTP 403 ``permission_denied``: the sandbox user may not read or write
    that file (file operations run as the sandbox user, as its code does), or
    the filesystem there is read-only.

    It is also a :class:`builtins.PermissionError`, so ``except
    PermissionError`` catches it as it would a local file's.
    """


class NotFoundError(PandaStackError, LookupError):
    """HTTP 404 ``not_found``: no such sandbox, context, file, snapshot or route
    in the caller's project."""


class MethodNotAllowedError(PandaStackError):
    """HTTP 405 ``method_not_allowed``: usually an SDK/server version mismatch."""


class ConflictError(PandaStackError):
    """HTTP 409 ``conflict``: the target's state forbids the operation (a busy
    code context, a sandbox being created or stopped, a non-empty directory)."""


class TemplateNotBuiltError(ConflictError):
    """HTTP 409 ``template_not_built``: build it with ``pandastack template build NAME``."""


class PayloadTooLargeError(PandaStackError):
    """HTTP 413 ``payload_too_large``: a body over the server's limit, or the
    sandbox's disk is full."""


class InternalServerError(PandaStackError):
    """HTTP 500 ``internal``: a server bug or host failure; see the server log."""


class SandboxError(PandaStackError):
    """The sandbox itself failed or cannot serve the request."""


class SandboxUnavailableError(SandboxError):
    """HTTP 503 ``sandbox_unavailable``: the sandbox's agent does not answer
    for now (it is starting, or dying and not yet known to be stopped), the
    server is shutting down, or its database cannot be reached (retry)."""


class SandboxStoppedError(SandboxError):
    """HTTP 410 ``sandbox_stopped``: the sandbox has stopped (killed, expired,
    out of memory, ...; the message says which) and never runs again. No
    retry helps: create a new sandbox. ``Sandbox.refresh()`` still shows its
    record, with ``stop_reason``."""


class SnapshotCorruptError(SandboxError):
    """``snapshot_corrupt``: a snapshot's files are missing, truncated or altered."""


class NetworkDeniedError(InvalidRequestError):
    """``network_denied``: a network policy entry lies inside the platform
    deny set (the host, private ranges, metadata, ...), which no policy can
    open; nothing changed."""


class PortUnreachableError(SandboxError):
    """``port_unreachable``: nothing answers on the sandbox port a request
    was proxied to (a server must listen on 0.0.0.0 inside)."""


class InsufficientStorageError(PandaStackError):
    """HTTP 507 ``insufficient_storage``: the server's disk is full (a
    snapshot, fork or pause could not be written; nothing was left behind)."""


class InsufficientMemoryError(PandaStackError):
    """HTTP 503 ``insufficient_memory``: the server's host is short of memory
    for another running sandbox (a create, restore, fork, or the resume of a
    paused one), and no quiet sandbox was left to suspend for it. Nothing
    was started: retry later, or pause or kill sandboxes."""


class TimeoutError(PandaStackError, builtins.TimeoutError):
    """An operation ran past its deadline: HTTP 504 ``timeout`` from the
    server, or ``client_timeout`` when the HTTP request itself timed out.

    It is also a :class:`builtins.TimeoutError`, so ``except TimeoutError``
    catches it whichever of the two names is in scope. A *cell* that runs past
    its ``timeout`` is not raised: it ends with ``Execution.error.name ==
    "TimeoutError"`` and the context keeps its variables.
    """


class StreamError(PandaStackError):
    """A streamed answer (NDJSON) broke off or could not be parsed."""


_BY_CODE: Dict[str, Type[PandaStackError]] = {
    "invalid_request": InvalidRequestError,
    "command_not_found": CommandNotFoundError,
    "unauthorized": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "method_not_allowed": MethodNotAllowedError,
    "conflict": ConflictError,
    "template_not_built": TemplateNotBuiltError,
    "payload_too_large": PayloadTooLargeError,
    "internal": InternalServerError,
    "sandbox_unavailable": SandboxUnavailableError,
    "sandbox_stopped": SandboxStoppedError,
    "snapshot_corrupt": SnapshotCorruptError,
    "insufficient_storage": InsufficientStorageError,
    "insufficient_memory": InsufficientMemoryError,
    "timeout": TimeoutError,
    "network_denied": NetworkDeniedError,
    "port_unreachable": PortUnreachableError,
}

_BY_STATUS: Dict[int, Type[PandaStackError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    410: SandboxStoppedError,
    413: PayloadTooLargeError,
    500: InternalServerError,
    503: SandboxUnavailableError,
    504: TimeoutError,
    507: InsufficientStorageError,
}


def error_from_response(code: Optional[str], message: str, status: Optional[int]) -> PandaStackError:
    """Build the exception for an error answer: by its code first (stable),
    then by HTTP status for answers that carry no code (a proxy in between)."""
    cls: Type[PandaStackError] = PandaStackError
    if code and code in _BY_CODE:
        cls = _BY_CODE[code]
    elif status is not None and status in _BY_STATUS:
        cls = _BY_STATUS[status]
    elif status is not None and status >= 500:
        cls = InternalServerError
    return cls(message, code=code or f"http_{status}", status=status)
