"""Directory watches: :meth:`Files.watch_dir` and its asyncio twin."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Mapping, Optional, Union

from ._base import stream_failure
from .commands import FOLLOW_READ_TIMEOUT
from .exceptions import PandaStackError, StreamError
from .models import FileEvent

if TYPE_CHECKING:
    from .client import Client

__all__ = ["WatchHandle", "AsyncWatchHandle"]

EventHandler = Callable[[FileEvent], Any]
AsyncEventHandler = Callable[[FileEvent], Union[Any, Awaitable[Any]]]

# The most events a handle keeps for get_new_events; past it the oldest go
# and an "overflow" event says so (as the server's own: list the directory
# again). A watch read only through on_event never fills memory.
MAX_PENDING = 10_000


# The tasks of running asyncio watches: a handle dropped by its caller (one
# used through on_event alone) must not leave its task to the collector.
_TASKS: "set[asyncio.Task[None]]" = set()


def _keep(pending: List[FileEvent], ev: FileEvent) -> None:
    pending.append(ev)
    if len(pending) > MAX_PENDING:
        del pending[: len(pending) - MAX_PENDING + 1]
        pending[0] = FileEvent(type="overflow", path="", name="", is_dir=False)


def _params(path: str, recursive: bool) -> Mapping[str, str]:
    params = {"path": path}
    if recursive:
        params["recursive"] = "true"
    return params


def _event(line: str) -> Optional[FileEvent]:
    """The event of one stream line; None for the ``watching`` line; an
    ``error`` line raises."""
    d = json.loads(line)
    kind = d.get("type")
    if kind == "error":
        raise stream_failure(d.get("error"))
    if kind in ("watching", "keepalive"):
        return None
    return FileEvent.from_dict(d)


class WatchHandle:
    """A watch of a directory in a sandbox, from :meth:`Files.watch_dir`.

    A thread reads its events as they come; :meth:`get_new_events` returns
    those that came since it was last called, and ``on_event`` (if given) is
    called with each, on that thread. The watch runs until :meth:`stop`, the
    end of a ``with`` block, or the directory's removal (its own ``remove``
    or ``rename`` event is the last). A failure of the watch (the sandbox
    stopped or paused) is raised by the next :meth:`get_new_events`."""

    def __init__(self, client: "Client", path: str, params: Mapping[str, str], on_event: Optional[EventHandler]) -> None:
        self._lock = threading.Lock()
        self._pending: List[FileEvent] = []
        self._error: Optional[BaseException] = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._resp: Any = None
        self._on_event = on_event
        self._thread = threading.Thread(target=self._run, args=(client, path, params), name="pandastack-watch", daemon=True)
        self._thread.start()
        self._ready.wait()
        with self._lock:
            err = self._error
        if err is not None:  # the watch never started: raise here
            self._thread.join()
            raise err

    def _run(self, client: "Client", path: str, params: Mapping[str, str]) -> None:
        try:
            with client._stream("GET", path, params=params, timeout=FOLLOW_READ_TIMEOUT) as resp:
                self._resp = resp
                for line in resp.iter_lines():
                    if self._stopping.is_set():
                        return
                    if not line:
                        continue
                    ev = _event(line)
                    if ev is None:
                        self._ready.set()
                        continue
                    with self._lock:
                        _keep(self._pending, ev)
                    if self._on_event is not None:
                        self._on_event(ev)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            if not self._stopping.is_set():
                with self._lock:
                    self._error = e
        finally:
            if not self._ready.is_set() and self._error is None and not self._stopping.is_set():
                with self._lock:
                    self._error = StreamError("the watch ended before it started", code="stream_error")
            self._ready.set()

    @property
    def running(self) -> bool:
        """Whether the watch still runs."""
        return self._thread.is_alive()

    def get_new_events(self) -> List[FileEvent]:
        """The events that came since the last call (oldest first). Once the
        watch failed and its events were taken, raises its error."""
        with self._lock:
            out, self._pending = self._pending, []
            err = self._error
            if not out and err is not None:
                self._error = None
        if not out and err is not None:
            raise err
        return out

    def stop(self) -> None:
        """End the watch (closing its stream); events not yet taken stay
        for :meth:`get_new_events`. May be called from ``on_event``."""
        self._stopping.set()
        resp = self._resp
        if resp is not None:
            # Closing the answer does not wake a thread blocked reading it:
            # shutting its socket down does.
            stream = resp.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
        if threading.current_thread() is not self._thread:  # from on_event: the thread ends on its own
            self._thread.join(timeout=10)

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class AsyncWatchHandle:
    """The asyncio twin of :class:`WatchHandle`, from
    :meth:`AsyncFiles.watch_dir`: a task reads the events; ``on_event`` may be
    a coroutine function."""

    def __init__(self) -> None:
        self._pending: List[FileEvent] = []
        self._error: Optional[BaseException] = None
        self._ready: asyncio.Event = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None
        self._stopping = False

    @classmethod
    async def start(cls, client: "Client", path: str, params: Mapping[str, str], on_event: Optional[AsyncEventHandler]) -> "AsyncWatchHandle":
        h = cls()
        h._task = asyncio.get_running_loop().create_task(h._run(client, path, params, on_event))
        _TASKS.add(h._task)
        h._task.add_done_callback(_TASKS.discard)
        try:
            await h._ready.wait()
        except BaseException:  # cancelled while the watch starts: it must not live on unseen
            await h.stop()
            raise
        if h._error is not None:
            err, h._error = h._error, None
            await asyncio.gather(h._task, return_exceptions=True)
            raise err
        return h

    async def _run(self, client: "Client", path: str, params: Mapping[str, str], on_event: Optional[AsyncEventHandler]) -> None:
        try:
            async with client._astream("GET", path, params=params, timeout=FOLLOW_READ_TIMEOUT) as resp:
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    ev = _event(line)
                    if ev is None:
                        self._ready.set()
                        continue
                    _keep(self._pending, ev)
                    if on_event is not None:
                        r = on_event(ev)
                        if inspect.isawaitable(r):
                            await r
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except (PandaStackError, Exception) as e:  # noqa: BLE001 - handed to the caller
            self._error = e
        finally:
            if not self._ready.is_set() and self._error is None and not self._stopping:
                self._error = StreamError("the watch ended before it started", code="stream_error")
            self._ready.set()

    @property
    def running(self) -> bool:
        """Whether the watch still runs."""
        return self._task is not None and not self._task.done()

    def get_new_events(self) -> List[FileEvent]:
        """As :meth:`WatchHandle.get_new_events`."""
        out, self._pending = self._pending, []
        if not out and self._error is not None:
            err, self._error = self._error, None
            raise err
        return out

    async def stop(self) -> None:
        """End the watch."""
        self._stopping = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def __aenter__(self) -> "AsyncWatchHandle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
