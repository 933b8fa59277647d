"""Background commands (``sandbox.exec(cmd, background=True)``) and the
``sandbox.commands`` namespace, which uses the names of E2B's SDK."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from ._base import ExecStreamParser, parse_line, sandbox_path, stream_failure
from .models import ExecResult, ProcessesKilled, ProcessInfo

if TYPE_CHECKING:  # pragma: no cover
    from .async_sandbox import AsyncSandbox
    from .sandbox import Sandbox

__all__ = ["CommandHandle", "Commands", "AsyncCommandHandle", "AsyncCommands"]

OutputHandler = Callable[[str], Any]

# How long a follow stream may go without a byte: a quiet server process is
# normal, so only a day of silence counts as a dead connection.
FOLLOW_READ_TIMEOUT = 86400.0


def _kept_output(events: Iterable[Mapping[str, Any]]) -> Tuple[str, str]:
    """The (stdout, stderr) of a process's output events; an error event raises."""
    out: List[str] = []
    err: List[str] = []
    for ev in events:
        kind = ev.get("type")
        if kind == "stdout":
            out.append(ev.get("data") or "")
        elif kind == "stderr":
            err.append(ev.get("data") or "")
        elif kind == "error":
            raise stream_failure(ev.get("error"))
    return "".join(out), "".join(err)


class CommandHandle:
    """A command running in the background in a sandbox. The server keeps
    its output (the latest 4 MiB), so it can be read at any time, from the
    start, by this handle or by one from :meth:`Sandbox.connect_process`.

    Iterating over the handle yields ``(stream, text)`` pairs, stream being
    ``"stdout"`` or ``"stderr"``, from the start of its output until it
    ends; :meth:`wait` gathers the same into an :class:`ExecResult`.
    """

    def __init__(self, sandbox: "Sandbox", info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self.info = info

    @property
    def pid(self) -> int:
        """The process id inside the sandbox."""
        return self.info.pid

    def __repr__(self) -> str:
        return f"CommandHandle(pid={self.pid}, cmd={self.info.cmd!r}, sandbox={self._sandbox.id!r})"

    def _path(self, sub: str) -> str:
        return sandbox_path(self._sandbox.id, f"/processes/{self.pid}{sub}")

    def _events(self, follow: bool, timeout: Optional[float]) -> Iterator[Mapping[str, Any]]:
        params = {"follow": "true"} if follow else None
        with self._sandbox.client._stream("GET", self._path("/output"), params=params, timeout=timeout) as resp:
            for line in resp.iter_lines():
                if line.strip():
                    yield parse_line(line)

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        for ev in self._events(True, FOLLOW_READ_TIMEOUT):
            kind = ev.get("type")
            if kind in ("stdout", "stderr"):
                yield kind, ev.get("data") or ""
            elif kind == "error":
                raise stream_failure(ev.get("error"))

    def output(self) -> Tuple[str, str]:
        """The (stdout, stderr) kept so far, without waiting."""
        return _kept_output(self._events(False, None))

    def wait(
        self,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        timeout: Optional[float] = None,
    ) -> ExecResult:
        """Wait for the command to end and return its :class:`ExecResult`
        (its output from the first byte kept). ``on_stdout`` and
        ``on_stderr`` see the output as it comes. ``timeout``: seconds the
        wait may go without any output before it gives up with a
        :class:`~pandastack.TimeoutError` (the command keeps running)."""
        parser = ExecStreamParser()
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr}
        with self._sandbox.client._stream(
            "GET", self._path("/output"), params={"follow": "true"}, timeout=timeout or FOLLOW_READ_TIMEOUT
        ) as resp:
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                action = parser.feed(line)
                if action is not None and handlers.get(action[0]) is not None:
                    handlers[action[0]](action[1])  # type: ignore[misc]
                if parser.result is not None:
                    break
        result = parser.finish()
        self.refresh()
        return result

    def send_stdin(self, data: Union[str, bytes], eof: bool = False) -> None:
        """Write ``data`` to the command's standard input; ``eof`` closes
        it afterwards. A command that has ended answers ConflictError."""
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        self._sandbox.client._request("POST", self._path("/stdin"), json={"data": text, "eof": bool(eof)})

    def close_stdin(self) -> None:
        """Close the command's standard input (it reads end of file)."""
        self.send_stdin("", eof=True)

    def kill(self) -> None:
        """SIGKILL the command and everything it started. Its output stays
        readable; killing one that has ended does nothing."""
        self._sandbox.client._request("POST", self._path("/kill"))

    def refresh(self) -> ProcessInfo:
        """Fetch :attr:`info` (running, exit_code, ...) again."""
        for p in self._sandbox.list_processes():
            if p.pid == self.pid:
                self.info = p
        return self.info


class Commands:
    """``sandbox.commands``: E2B's names for running commands, as aliases of
    :meth:`Sandbox.exec` and the background-process methods. Unlike E2B's,
    ``run`` does not raise on a non-zero exit: check ``exit_code``."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def run(self, cmd: Union[str, List[str]], background: bool = False, **kwargs: Any) -> Union[ExecResult, CommandHandle]:
        """Alias of :meth:`Sandbox.exec` (same arguments)."""
        return self._sandbox.exec(cmd, background=background, **kwargs)

    def list(self) -> List[ProcessInfo]:
        """Alias of :meth:`Sandbox.list_processes`."""
        return self._sandbox.list_processes()

    def kill(self, pid: int) -> None:
        """Alias of :meth:`Sandbox.kill_process`."""
        self._sandbox.kill_process(pid)

    def kill_all(self) -> ProcessesKilled:
        """Alias of :meth:`Sandbox.kill_all_processes`."""
        return self._sandbox.kill_all_processes()

    def send_stdin(self, pid: int, data: Union[str, bytes]) -> None:
        """Write to a background process's standard input."""
        self._sandbox.connect_process(pid).send_stdin(data)

    def connect(self, pid: int) -> CommandHandle:
        """Alias of :meth:`Sandbox.connect_process`."""
        return self._sandbox.connect_process(pid)


class AsyncCommandHandle:
    """The asyncio form of :class:`CommandHandle`, from
    ``await async_sandbox.exec(cmd, background=True)``: ``async for stream,
    text in handle``, ``await handle.wait()``, ``output``, ``send_stdin``,
    ``close_stdin``, ``kill``."""

    def __init__(self, sandbox: "AsyncSandbox", info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self.info = info

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"AsyncCommandHandle(pid={self.pid}, cmd={self.info.cmd!r}, sandbox={self._sandbox.id!r})"

    def _path(self, sub: str) -> str:
        return sandbox_path(self._sandbox.id, f"/processes/{self.pid}{sub}")

    async def _lines(self, timeout: Optional[float]) -> AsyncIterator[str]:
        client = self._sandbox.client
        async with client._astream("GET", self._path("/output"), params={"follow": "true"}, timeout=timeout or FOLLOW_READ_TIMEOUT) as resp:
            async for line in resp.aiter_lines():
                if line.strip():
                    yield line

    async def __aiter__(self) -> AsyncIterator[Tuple[str, str]]:
        async for line in self._lines(None):
            ev = parse_line(line)
            kind = ev.get("type")
            if kind in ("stdout", "stderr"):
                yield kind, ev.get("data") or ""
            elif kind == "error":
                raise stream_failure(ev.get("error"))

    async def wait(
        self,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        timeout: Optional[float] = None,
    ) -> ExecResult:
        """See :meth:`CommandHandle.wait`; the callbacks may be coroutines."""
        parser = ExecStreamParser()
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr}
        async for line in self._lines(timeout):
            action = parser.feed(line)
            fn = handlers.get(action[0]) if action is not None else None
            if fn is not None:
                r = fn(action[1])  # type: ignore[index]
                if inspect.isawaitable(r):
                    await r
            if parser.result is not None:
                break
        result = parser.finish()
        await self.refresh()
        return result

    async def output(self) -> Tuple[str, str]:
        """The (stdout, stderr) kept so far, without waiting."""
        async with self._sandbox.client._astream("GET", self._path("/output")) as resp:
            return _kept_output([parse_line(line) async for line in resp.aiter_lines() if line.strip()])

    async def send_stdin(self, data: Union[str, bytes], eof: bool = False) -> None:
        """See :meth:`CommandHandle.send_stdin`."""
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        await self._sandbox.client._arequest("POST", self._path("/stdin"), json={"data": text, "eof": bool(eof)})

    async def close_stdin(self) -> None:
        """Close the command's standard input (it reads end of file)."""
        await self.send_stdin("", eof=True)

    async def kill(self) -> None:
        await self._sandbox.client._arequest("POST", self._path("/kill"))

    async def refresh(self) -> ProcessInfo:
        for p in await self._sandbox.list_processes():
            if p.pid == self.pid:
                self.info = p
        return self.info


class AsyncCommands:
    """``async_sandbox.commands``: the asyncio form of :class:`Commands`."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sandbox = sandbox

    async def run(
        self, cmd: Union[str, List[str]], background: bool = False, **kwargs: Any
    ) -> Union[ExecResult, AsyncCommandHandle]:
        """Alias of :meth:`AsyncSandbox.exec` (same arguments)."""
        return await self._sandbox.exec(cmd, background=background, **kwargs)

    async def list(self) -> List[ProcessInfo]:
        """Alias of :meth:`AsyncSandbox.list_processes`."""
        return await self._sandbox.list_processes()

    async def kill(self, pid: int) -> None:
        """Alias of :meth:`AsyncSandbox.kill_process`."""
        await self._sandbox.kill_process(pid)

    async def kill_all(self) -> ProcessesKilled:
        """Alias of :meth:`AsyncSandbox.kill_all_processes`."""
        return await self._sandbox.kill_all_processes()

    async def send_stdin(self, pid: int, data: Union[str, bytes]) -> None:
        """Write to a background process's standard input."""
        await (await self._sandbox.connect_process(pid)).send_stdin(data)

    async def connect(self, pid: int) -> AsyncCommandHandle:
        """Alias of :meth:`AsyncSandbox.connect_process`."""
        return await self._sandbox.connect_process(pid)
