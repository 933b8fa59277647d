"""PandaStack: run untrusted, AI-generated code in isolated sandboxes on
your own server.

Quick start (``PANDASTACK_API_KEY`` set, a server at ``PANDASTACK_API``)::

    from pandastack import Sandbox

    with Sandbox.create(template="code-interpreter") as sandbox:
        ctx = sandbox.create_code_context()
        ctx.run_code("x = 41")
        print(ctx.run_code("x + 1").text)        # 42
        print(sandbox.exec("uname -a").stdout)

The asyncio API is the same with ``AsyncSandbox`` and ``await``.
"""

from ._version import __version__
from .async_sandbox import AsyncCodeContext, AsyncFiles, AsyncSandbox
from .client import DEFAULT_API_URL, Client
from .commands import AsyncCommandHandle, CommandHandle, Commands
from .exceptions import (
    APIConnectionError,
    AuthenticationError,
    CommandNotFoundError,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PermissionDeniedError,
    PandaStackError,
    PayloadTooLargeError,
    SandboxError,
    SandboxUnavailableError,
    SandboxStoppedError,
    SnapshotCorruptError,
    InsufficientStorageError,
    InsufficientMemoryError,
    NetworkDeniedError,
    PortUnreachableError,
    StreamError,
    TemplateNotBuiltError,
    TimeoutError,
)
from .models import (
    Chart,
    ChartElement,
    ExecResult,
    Execution,
    ExecutionError,
    FileEvent,
    FileInfo,
    Logs,
    ProcessInfo,
    ProcessesKilled,
    Result,
    SandboxStats,
    SnapshotInfo,
    Table,
    PoolInfo,
    TemplateInfo,
)
from .sandbox import CodeContext, Files, Sandbox
from .terminal import Terminal
from .watch import AsyncWatchHandle, WatchHandle

__all__ = [
    "Terminal",
    "__version__",
    "DEFAULT_API_URL",
    # sandboxes and code
    "Client",
    "Sandbox",
    "CodeContext",
    "Files",
    "AsyncSandbox",
    "AsyncCodeContext",
    "AsyncFiles",
    "CommandHandle",
    "AsyncCommandHandle",
    "Commands",
    "WatchHandle",
    "AsyncWatchHandle",
    # data
    "Execution",
    "Result",
    "ExecutionError",
    "ExecResult",
    "FileInfo",
    "FileEvent",
    "PoolInfo",
    "TemplateInfo",
    "SnapshotInfo",
    "SandboxStats",
    "ProcessInfo",
    "ProcessesKilled",
    "Chart",
    "ChartElement",
    "Table",
    "Logs",
    # errors
    "PandaStackError",
    "ConfigurationError",
    "APIConnectionError",
    "InvalidRequestError",
    "CommandNotFoundError",
    "AuthenticationError",
    "NotFoundError",
    "PermissionDeniedError",
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
    "NetworkDeniedError",
    "PortUnreachableError",
    "TimeoutError",
    "StreamError",
]
