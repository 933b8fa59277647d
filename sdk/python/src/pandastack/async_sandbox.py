"""The asyncio API: :class:`AsyncSandbox`, :class:`AsyncCodeContext` and
:class:`AsyncFiles`, the same methods as the synchronous ones, as
coroutines::

    async with await AsyncSandbox.create(template="code-interpreter") as sb:
        ctx = await sb.create_code_context()
        ex = await ctx.run_code("6 * 7")

Callbacks (``on_stdout`` ...) may be plain functions or coroutine functions.
"""

from __future__ import annotations

import inspect
import os
from typing import (
    IO,
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import anyio

from ._base import (
    EXEC_DEFAULT_TIMEOUT,
    FILE_CHUNK,
    RUN_DEFAULT_TIMEOUT,
    STREAM_MEDIA_TYPE,
    Action,
    CodeStreamParser,
    Command,
    ExecStreamParser,
    FrameDecoder,
    SandboxRecord,
    context_args,
    context_path,
    create_body,
    exec_body,
    fork_body,
    list_params,
    next_page,
    unpaged_server,
    port_path,
    read_timeout,
    run_body,
    sandbox_path,
    set_network_body,
    snapshot_body,
    snapshot_params,
    snapshot_path,
)
from .client import Client, default_client
from .commands import AsyncCommandHandle, AsyncCommands
from .exceptions import NotFoundError, PandaStackError, SandboxStoppedError
from .watch import AsyncEventHandler, AsyncWatchHandle
from .watch import _params as _watch_params
from .models import ExecResult, Execution, ExecutionError, FileEvent, FileInfo, ProcessesKilled, ProcessInfo, Result, SandboxStats, SnapshotInfo

__all__ = ["AsyncSandbox", "AsyncCodeContext", "AsyncFiles"]

OutputHandler = Callable[[str], Union[Any, Awaitable[Any]]]
ResultHandler = Callable[[Result], Union[Any, Awaitable[Any]]]
ErrorHandler = Callable[[ExecutionError], Union[Any, Awaitable[Any]]]
PathLike = Union[str, "os.PathLike[str]"]


async def _dispatch(action: Action, handlers: Mapping[str, Optional[Callable[[Any], Any]]]) -> None:
    fn = handlers.get(action[0])
    if fn is not None:
        r = fn(action[1])
        if inspect.isawaitable(r):
            await r


async def _run(
    client: Client,
    path: str,
    body: Dict[str, Any],
    timeout: Optional[float],
    handlers: Mapping[str, Optional[Callable[[Any], Any]]],
) -> Execution:
    read = read_timeout(timeout, RUN_DEFAULT_TIMEOUT)
    if not any(handlers.values()):
        return Execution.from_dict((await client._arequest("POST", path, json=body, timeout=read)).json())
    parser = CodeStreamParser()
    async with client._astream("POST", path, json=body, headers={"Accept": "application/x-ndjson"}, timeout=read) as resp:
        async for line in resp.aiter_lines():
            if not line.strip():
                continue
            action = parser.feed(line)
            if action is not None:
                await _dispatch(action, handlers)
            if parser.execution is not None:
                break
    execution, owed = parser.finish()
    for action in owed:
        await _dispatch(action, handlers)
    return execution


class AsyncSandbox(SandboxRecord):
    """The asyncio twin of :class:`pandastack.Sandbox`; every method that
    talks to the server is a coroutine. ``async with`` kills it on exit."""

    def __init__(self, data: Mapping[str, Any], client: Client) -> None:
        """Wrap an API sandbox object; use :meth:`create` or :meth:`connect`."""
        self._update(data)
        self._client = client
        self.files = AsyncFiles(self)
        self.commands = AsyncCommands(self)

    @property
    def client(self) -> Client:
        """The Client this sandbox talks through."""
        return self._client

    @classmethod
    async def create(
        cls,
        template: str = "base",
        ttl_seconds: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        snapshot_id: Optional[str] = None,
        cpu: Optional[int] = None,
        memory_mb: Optional[int] = None,
        client: Optional[Client] = None,
        auto_resume: Optional[bool] = None,
        idle_timeout_seconds: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        disk_mb: Optional[int] = None,
    ) -> "AsyncSandbox":
        """Boot a new sandbox; see :meth:`pandastack.Sandbox.create`."""
        c = client or default_client()
        body = create_body(
            template, ttl_seconds, metadata, env, snapshot_id, cpu, memory_mb, auto_resume, idle_timeout_seconds, network, disk_mb
        )
        return cls((await c._arequest("POST", "/v1/sandboxes", json=body)).json(), c)

    @classmethod
    async def connect(cls, sandbox_id: str, client: Optional[Client] = None) -> "AsyncSandbox":
        """Attach to an existing sandbox by id; raises NotFoundError."""
        c = client or default_client()
        return cls((await c._arequest("GET", sandbox_path(sandbox_id))).json(), c)

    @classmethod
    async def list(
        cls,
        metadata: Optional[Mapping[str, str]] = None,
        state: Optional[Union[str, Sequence[str]]] = None,
        client: Optional[Client] = None,
    ) -> List["AsyncSandbox"]:
        """The project's sandboxes whose metadata has every given pair."""
        c = client or default_client()
        out: List["AsyncSandbox"] = []
        after: Optional[str] = None
        while True:  # a page at a time, oldest first
            try:
                data = (await c._arequest("GET", "/v1/sandboxes", params=list_params(metadata, state, after))).json()
            except PandaStackError as e:
                if not unpaged_server(e, after):
                    raise
                data = (await c._arequest("GET", "/v1/sandboxes", params=list_params(metadata, state, paged=False))).json()
            out += [cls(d, c) for d in data.get("sandboxes") or []]
            after = next_page(data, after)
            if after is None:
                return out

    async def refresh(self) -> "AsyncSandbox":
        """Fetch the sandbox's current state; returns self."""
        self._update((await self._client._arequest("GET", sandbox_path(self.id))).json())
        return self

    async def is_running(self) -> bool:
        """Ask the server whether the sandbox is running now."""
        try:
            return (await self.refresh()).state == "running"
        except NotFoundError:
            return False

    async def kill(self) -> None:
        """Stop the sandbox and delete everything of it; idempotent."""
        try:
            await self._client._arequest("DELETE", sandbox_path(self.id))
        except NotFoundError:
            pass
        self._data["state"] = "stopped"
        self._data.setdefault("stop_reason", "killed")

    async def set_network(
        self,
        allow_internet_access: Union[bool, Mapping[str, Any]] = False,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
    ) -> None:
        """Replace the egress policy; see :meth:`pandastack.Sandbox.set_network`."""
        body = set_network_body(allow_internet_access, allow_out, deny_out)
        self._update((await self._client._arequest("PUT", sandbox_path(self.id, "/network"), json=body)).json())

    async def network_log(self) -> List[Dict[str, Any]]:
        """The egress log; see :meth:`pandastack.Sandbox.network_log`."""
        return list((await self._client._arequest("GET", sandbox_path(self.id, "/network/log"))).json().get("entries") or [])

    async def stats(self) -> SandboxStats:
        """What the sandbox uses now; see :meth:`pandastack.Sandbox.stats`."""
        return SandboxStats.from_dict((await self._client._arequest("GET", sandbox_path(self.id, "/stats"))).json())

    async def get_url(self, port: int, token: bool = True, ttl_seconds: Optional[int] = None) -> str:
        """A port's URL; see :meth:`pandastack.Sandbox.get_url`."""
        if not token:
            return self._client.api_url + port_path(self.id, port)
        body = {} if ttl_seconds is None else {"ttl_seconds": int(ttl_seconds)}
        return str((await self._client._arequest("POST", port_path(self.id, port) + "token", json=body)).json()["url"])

    async def set_ttl(self, seconds: int) -> None:
        """Make the sandbox expire ``seconds`` from now."""
        r = await self._client._arequest("PATCH", sandbox_path(self.id), json={"ttl_seconds": int(seconds)})
        self._update(r.json())

    async def set_idle_timeout(self, seconds: int) -> None:
        """Set the seconds idle after which the server suspends it (0: never)."""
        r = await self._client._arequest("PATCH", sandbox_path(self.id), json={"idle_timeout_seconds": int(seconds)})
        self._update(r.json())

    async def set_timeout(self, seconds: int) -> None:
        """Alias of :meth:`set_ttl`, under the name E2B's SDK uses."""
        await self.set_ttl(seconds)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()

    async def exec(
        self,
        cmd: Command,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Union[str, bytes]] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        background: bool = False,
    ) -> Union[ExecResult, AsyncCommandHandle]:
        """Run one command and wait for it, or start it in the background
        and return an :class:`AsyncCommandHandle`; see
        :meth:`pandastack.Sandbox.exec`."""
        body = exec_body(cmd, timeout, env, cwd, stdin)
        path = sandbox_path(self.id, "/exec")
        if background:
            if on_stdout is not None or on_stderr is not None:
                raise TypeError("on_stdout/on_stderr go to AsyncCommandHandle.wait() for a background command")
            body["background"] = True
            data = (await self._client._arequest("POST", path, json=body)).json()
            return AsyncCommandHandle(self, ProcessInfo.from_dict(data))
        read = read_timeout(timeout, EXEC_DEFAULT_TIMEOUT)
        if on_stdout is None and on_stderr is None:
            return ExecResult.from_dict((await self._client._arequest("POST", path, json=body, timeout=read)).json())
        parser = ExecStreamParser()
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr}
        accept = STREAM_MEDIA_TYPE + ", application/x-ndjson"
        async with self._client._astream("POST", path, json=body, headers={"Accept": accept}, timeout=read) as resp:
            if resp.headers.get("content-type", "").startswith(STREAM_MEDIA_TYPE):
                frames = FrameDecoder()
                async for chunk in resp.aiter_bytes():
                    for action in frames.actions(parser, chunk):
                        await _dispatch(action, handlers)
                    if parser.result is not None:
                        break
                if parser.result is None:
                    frames.finish()
            else:  # a server older than the binary stream
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    action = parser.feed(line)
                    if action is not None:
                        await _dispatch(action, handlers)
                    if parser.result is not None:
                        break
        return parser.finish()

    async def list_processes(self) -> List[ProcessInfo]:
        """Background processes, oldest first; see :meth:`pandastack.Sandbox.list_processes`."""
        data = (await self._client._arequest("GET", sandbox_path(self.id, "/processes"))).json()
        return [ProcessInfo.from_dict(d) for d in data.get("processes") or []]

    async def kill_process(self, pid: int) -> None:
        """SIGKILL background process ``pid`` and everything it started."""
        await self._client._arequest("POST", sandbox_path(self.id, f"/processes/{int(pid)}/kill"))

    async def kill_all_processes(self) -> ProcessesKilled:
        """SIGKILL every process of the sandbox user but the kernels; see
        :meth:`pandastack.Sandbox.kill_all_processes`."""
        data = (await self._client._arequest("POST", sandbox_path(self.id, "/processes/kill"))).json()
        return ProcessesKilled.from_dict(data)

    async def connect_process(self, pid: int) -> AsyncCommandHandle:
        """An :class:`AsyncCommandHandle` for background process ``pid``; see
        :meth:`pandastack.Sandbox.connect_process`.

        Raises:
            NotFoundError: no such background process.
        """
        for p in await self.list_processes():
            if p.pid == pid:
                return AsyncCommandHandle(self, p)
        raise NotFoundError(f"no background process {pid} in sandbox {self.id}", code="not_found", status=404)

    async def create_code_context(
        self,
        language: str = "python",
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        auto_restart: Optional[bool] = None,
    ) -> "AsyncCodeContext":
        """Start a persistent kernel; see :meth:`pandastack.Sandbox.create_code_context`."""
        body: Dict[str, Any] = {"language": language}
        if cwd is not None:
            body["cwd"] = cwd
        if env is not None:
            body["env"] = dict(env)
        if auto_restart is not None:
            body["auto_restart"] = bool(auto_restart)
        data = (await self._client._arequest("POST", sandbox_path(self.id, "/contexts"), json=body)).json()
        return AsyncCodeContext._from_dict(self, data)

    async def list_code_contexts(self) -> List["AsyncCodeContext"]:
        """The sandbox's live code contexts."""
        data = (await self._client._arequest("GET", sandbox_path(self.id, "/contexts"))).json()
        return [AsyncCodeContext._from_dict(self, d) for d in data.get("contexts") or []]

    async def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        on_result: Optional[ResultHandler] = None,
        on_error: Optional[ErrorHandler] = None,
        env: Optional[Mapping[str, str]] = None,
        context: Optional[Union["AsyncCodeContext", str]] = None,
    ) -> Execution:
        """Run code in the sandbox's default context of ``language``, or in
        ``context``; see :meth:`pandastack.Sandbox.run_code`."""
        cid = context.id if isinstance(context, AsyncCodeContext) else context
        body = run_body(code, timeout, env, language=language if cid else (language or "python"), context_id=cid)
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr, "on_result": on_result, "on_error": on_error}
        return await _run(self._client, sandbox_path(self.id, "/run_code"), body, timeout, handlers)

    async def snapshot(self, metadata: Optional[Mapping[str, str]] = None) -> str:
        """Save the sandbox's whole state; returns the snapshot id. See
        :meth:`pandastack.Sandbox.snapshot`."""
        return (await self.snapshot_info(metadata)).id

    async def snapshot_info(self, metadata: Optional[Mapping[str, str]] = None) -> SnapshotInfo:
        """Like :meth:`snapshot`, returning the whole snapshot record."""
        r = await self._client._arequest("POST", sandbox_path(self.id, "/snapshots"), json=snapshot_body(metadata))
        return SnapshotInfo.from_dict(r.json())

    @classmethod
    async def list_snapshots(
        cls, metadata: Optional[Mapping[str, str]] = None, client: Optional[Client] = None
    ) -> List[SnapshotInfo]:
        """The project's snapshots whose metadata has every given pair."""
        c = client or default_client()
        data = (await c._arequest("GET", "/v1/snapshots", params=snapshot_params(metadata))).json()
        return [SnapshotInfo.from_dict(d) for d in data.get("snapshots") or []]

    @classmethod
    async def get_snapshot(cls, snapshot_id: str, client: Optional[Client] = None) -> SnapshotInfo:
        """One snapshot; raises NotFoundError."""
        c = client or default_client()
        return SnapshotInfo.from_dict((await c._arequest("GET", snapshot_path(snapshot_id))).json())

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, client: Optional[Client] = None) -> None:
        """Delete a snapshot; sandboxes restored from it are not affected."""
        c = client or default_client()
        await c._arequest("DELETE", snapshot_path(snapshot_id))

    async def fork(
        self,
        count: int = 1,
        ttl_seconds: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[Mapping[str, Any]] = None,
    ) -> List["AsyncSandbox"]:
        """Make ``count`` independent copies of this sandbox as it is now;
        see :meth:`pandastack.Sandbox.fork`."""
        r = await self._client._arequest("POST", sandbox_path(self.id, "/fork"), json=fork_body(count, ttl_seconds, metadata, network))
        return [type(self)(d, self._client) for d in r.json().get("sandboxes") or []]

    async def pause(self) -> None:
        """Checkpoint the sandbox to disk; its state becomes ``"paused"``."""
        self._update((await self._client._arequest("POST", sandbox_path(self.id, "/pause"))).json())

    async def resume(self) -> None:
        """Bring a paused sandbox back; its state becomes ``"running"``."""
        self._update((await self._client._arequest("POST", sandbox_path(self.id, "/resume"))).json())


class AsyncCodeContext:
    """The asyncio twin of :class:`pandastack.CodeContext`."""

    def __init__(
        self, sandbox: AsyncSandbox, context_id: str, language: str = "python", cwd: str = "", auto_restart: bool = True
    ) -> None:
        self.sandbox = sandbox
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self.auto_restart = auto_restart

    @classmethod
    def _from_dict(cls, sandbox: AsyncSandbox, d: Mapping[str, Any]) -> "AsyncCodeContext":
        return cls(sandbox, *context_args(d))

    @classmethod
    async def connect(
        cls, sandbox: Union[AsyncSandbox, str], context_id: str, client: Optional[Client] = None
    ) -> "AsyncCodeContext":
        """Reattach to a context by id; raises NotFoundError."""
        sb = sandbox if isinstance(sandbox, AsyncSandbox) else await AsyncSandbox.connect(sandbox, client=client)
        for ctx in await sb.list_code_contexts():
            if ctx.id == context_id:
                return ctx
        raise NotFoundError(f"code context {context_id} not found in sandbox {sb.id}", code="not_found", status=404)

    def __repr__(self) -> str:
        return f"AsyncCodeContext(id={self.id!r}, language={self.language!r}, sandbox_id={self.sandbox.id!r})"

    async def run_code(
        self,
        code: str,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        on_result: Optional[ResultHandler] = None,
        on_error: Optional[ErrorHandler] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """Run code as the next cell; see :meth:`pandastack.CodeContext.run_code`."""
        body = run_body(code, timeout, env)
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr, "on_result": on_result, "on_error": on_error}
        return await _run(self.sandbox.client, context_path(self.sandbox.id, self.id, "/run"), body, timeout, handlers)

    async def interrupt(self) -> None:
        """Interrupt the cell running now; the kernel lives on."""
        await self.sandbox.client._arequest("POST", context_path(self.sandbox.id, self.id, "/interrupt"))

    async def restart(self) -> None:
        """Restart the kernel; its state is lost, the id stays."""
        r = await self.sandbox.client._arequest("POST", context_path(self.sandbox.id, self.id, "/restart"))
        d = r.json()
        self.language = str(d.get("language") or self.language)
        self.cwd = str(d.get("cwd") or self.cwd)

    async def close(self) -> None:
        """Shut the kernel down; idempotent. Closing a context that is
        already gone (or whose sandbox is gone: killed, or stopped by its TTL
        or a failure) is not an error."""
        try:
            await self.sandbox.client._arequest("DELETE", context_path(self.sandbox.id, self.id))
        except (NotFoundError, SandboxStoppedError):
            pass


class AsyncFiles:
    """The asyncio twin of :class:`pandastack.sandbox.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def _path(self, sub: str = "") -> str:
        return sandbox_path(self._sandbox.id, "/files" + sub)

    async def write(self, path: str, data: Union[bytes, bytearray, memoryview, str, IO[bytes]]) -> FileInfo:
        """Write ``data`` to ``path`` (``str`` as UTF-8; a binary file object
        is streamed)."""
        content: Any
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = _aiter_file(data)
        else:
            raise TypeError(f"data must be bytes, str or a binary file object, got {type(data).__name__}")
        r = await self._sandbox.client._arequest(
            "PUT", self._path(), params={"path": path}, content=content, headers={"Content-Type": "application/octet-stream"}
        )
        return FileInfo.from_dict(r.json())

    async def read(self, path: str) -> bytes:
        """The whole content of the file at ``path``."""
        return (await self._sandbox.client._arequest("GET", self._path(), params={"path": path})).content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of the file at ``path``, decoded."""
        return (await self.read(path)).decode(encoding)

    async def upload(self, local_path: PathLike, remote_path: str) -> FileInfo:
        """Stream a local file into the sandbox, chunk by chunk."""
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as f:
            r = await self._sandbox.client._arequest(
                "PUT",
                self._path(),
                params={"path": remote_path},
                content=_aiter_file(f),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            )
        return FileInfo.from_dict(r.json())

    async def download(self, remote_path: str, local_path: PathLike) -> int:
        """Stream a file of the sandbox to ``local_path``; returns the number
        of bytes written. A failed download leaves no partial file."""
        n = 0
        tmp = f"{os.fspath(local_path)}.part"
        try:
            async with self._sandbox.client._astream("GET", self._path(), params={"path": remote_path}) as resp:
                with open(tmp, "wb") as f:
                    async for chunk in resp.aiter_bytes(FILE_CHUNK):
                        await anyio.to_thread.run_sync(f.write, chunk)
                        n += len(chunk)
            os.replace(tmp, local_path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return n

    async def list(self, path: str = ".") -> List[FileInfo]:
        """The entries of the directory at ``path``."""
        data = (await self._sandbox.client._arequest("GET", self._path("/list"), params={"path": path})).json()
        return [FileInfo.from_dict(d) for d in data.get("files") or []]

    async def stat(self, path: str) -> FileInfo:
        """Describe the file at ``path``; raises NotFoundError."""
        r = await self._sandbox.client._arequest("GET", self._path("/stat"), params={"path": path})
        return FileInfo.from_dict(r.json())

    async def exists(self, path: str) -> bool:
        """Whether anything is at ``path``; a sandbox that is gone raises
        :class:`NotFoundError` (see :meth:`pandastack.Files.exists`)."""
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            await self._sandbox.client._arequest("GET", sandbox_path(self._sandbox.id))
            return False

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file or directory (``recursive`` for a non-empty one)."""
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        await self._sandbox.client._arequest("DELETE", self._path(), params=params)

    async def mkdir(self, path: str) -> FileInfo:
        """Create a directory and its missing parents."""
        r = await self._sandbox.client._arequest("POST", self._path("/mkdir"), params={"path": path})
        return FileInfo.from_dict(r.json())

    async def watch_dir(self, path: str, on_event: Optional[AsyncEventHandler] = None, recursive: bool = False) -> AsyncWatchHandle:
        """As :meth:`pandastack.sandbox.Files.watch_dir`; ``on_event`` may be a
        coroutine function. The watch runs as an asyncio task."""
        return await AsyncWatchHandle.start(self._sandbox.client, self._path("/watch"), _watch_params(path, recursive), on_event)

    async def rename(self, old_path: str, new_path: str, overwrite: bool = False) -> FileInfo:
        """Move or rename a file or directory (``overwrite`` to replace what
        is at ``new_path``)."""
        params = {"path": old_path, "to": new_path}
        if overwrite:
            params["overwrite"] = "true"
        r = await self._sandbox.client._arequest("POST", self._path("/rename"), params=params)
        return FileInfo.from_dict(r.json())


async def _aiter_file(f: IO[bytes]) -> AsyncIterator[bytes]:
    while True:
        chunk = await anyio.to_thread.run_sync(f.read, FILE_CHUNK)
        if not chunk:
            return
        yield chunk
