"""The synchronous API: :class:`Sandbox`, :class:`CodeContext` and
:class:`Files`. For asyncio, see :mod:`pandastack.async_sandbox`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, IO, Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Union, overload

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
from .commands import CommandHandle, Commands
from .exceptions import NotFoundError, PandaStackError, SandboxStoppedError
from .watch import WatchHandle
from .watch import _params as _watch_params
from .models import ExecResult, Execution, ExecutionError, FileEvent, FileInfo, ProcessesKilled, ProcessInfo, Result, SandboxStats, SnapshotInfo

if TYPE_CHECKING:  # pragma: no cover
    from .terminal import Terminal

__all__ = ["Sandbox", "CodeContext", "Files"]

OutputHandler = Callable[[str], Any]
ResultHandler = Callable[[Result], Any]
ErrorHandler = Callable[[ExecutionError], Any]
PathLike = Union[str, "os.PathLike[str]"]


def _dispatch(action: Action, handlers: Mapping[str, Optional[Callable[[Any], Any]]]) -> None:
    fn = handlers.get(action[0])
    if fn is not None:
        fn(action[1])


def _run(
    client: Client,
    path: str,
    body: Dict[str, Any],
    timeout: Optional[float],
    handlers: Mapping[str, Optional[Callable[[Any], Any]]],
) -> Execution:
    """POST a run, streaming when any handler is set."""
    read = read_timeout(timeout, RUN_DEFAULT_TIMEOUT)
    if not any(handlers.values()):
        return Execution.from_dict(client._request("POST", path, json=body, timeout=read).json())
    parser = CodeStreamParser()
    with client._stream("POST", path, json=body, headers={"Accept": "application/x-ndjson"}, timeout=read) as resp:
        for line in resp.iter_lines():
            if not line.strip():
                continue
            action = parser.feed(line)
            if action is not None:
                _dispatch(action, handlers)
            if parser.execution is not None:
                break
    execution, owed = parser.finish()
    for action in owed:
        _dispatch(action, handlers)
    return execution


class Sandbox(SandboxRecord):
    """A running sandbox: an isolated gVisor container on the PandaStack
    server, with its own filesystem, processes and code kernels.

    Make one with :meth:`create`, attach to an existing one with
    :meth:`connect`. Used as a context manager it is killed on exit::

        with Sandbox.create(template="code-interpreter") as sb:
            print(sb.run_code("6 * 7").text)   # "42"

    Attributes ``id``, ``template``, ``metadata``, ``state``, ``expires_at``
    (and ``cpu``, ``memory_mb``, ``created_at``) describe it as of the last
    answer from the server; :meth:`refresh` fetches them again.
    """

    def __init__(self, data: Mapping[str, Any], client: Client) -> None:
        """Wrap an API sandbox object; use :meth:`create` or :meth:`connect`."""
        self._update(data)
        self._client = client
        self.files = Files(self)
        #: E2B's names for commands: ``commands.run`` is :meth:`exec`.
        self.commands = Commands(self)

    @property
    def client(self) -> Client:
        """The Client this sandbox talks through."""
        return self._client

    # ----- life cycle ----------------------------------------------------

    @classmethod
    def create(
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
    ) -> "Sandbox":
        """Boot a new sandbox and return it once it runs.

        Args:
            template: a template built on the server (``"base"``,
                ``"code-interpreter"``, ...). Ignored with ``snapshot_id``.
            ttl_seconds: seconds until the server stops it (server default
                300); extend later with :meth:`set_ttl`.
            metadata: string labels, to find it again with :meth:`list`.
            env: environment variables of every command and kernel in it.
            snapshot_id: restore this snapshot (see :meth:`snapshot`)
                instead of booting a template: files, processes and code
                contexts come back as they were. ``env``, ``cpu``,
                ``memory_mb`` and ``disk_mb`` are the snapshot's then:
                giving them too is an :class:`InvalidRequestError`.
            cpu, memory_mb: override the template's limits.
            disk_mb: the sandbox's disk (its writable layer) in MiB; default
                the template's.
            client: the server and key to use; default from the environment.
            auto_resume: while paused, any request resumes the sandbox
                instead of answering :class:`ConflictError`.
            idle_timeout_seconds: suspend it to disk after this many idle
                seconds; the next request resumes it transparently. 0:
                never; default the server's (300).
            network: egress policy, e.g. ``{"allow_internet_access": False,
                "allow_out": ["api.example.com", "1.2.3.0/24"]}``; default
                the server's (internet unless configured otherwise). In a
                policy, ``allow_internet_access`` is False unless given: a
                policy of only ``allow_out`` reaches only those.

        Raises:
            ConfigurationError: no client and ``PANDASTACK_API_KEY`` unset.
            TemplateNotBuiltError: the template is known but not built.
            NotFoundError: no such template or snapshot.
            InvalidRequestError: a value out of range.
        """
        c = client or default_client()
        body = create_body(
            template, ttl_seconds, metadata, env, snapshot_id, cpu, memory_mb, auto_resume, idle_timeout_seconds, network, disk_mb
        )
        return cls(c._request("POST", "/v1/sandboxes", json=body).json(), c)

    @classmethod
    def connect(cls, sandbox_id: str, client: Optional[Client] = None) -> "Sandbox":
        """Attach to an existing sandbox by id (from another process, say).

        Raises:
            NotFoundError: no such sandbox in this API key's project.
        """
        c = client or default_client()
        return cls(c._request("GET", sandbox_path(sandbox_id)).json(), c)

    @classmethod
    def list(
        cls,
        metadata: Optional[Mapping[str, str]] = None,
        state: Optional[Union[str, Sequence[str]]] = None,
        client: Optional[Client] = None,
    ) -> List["Sandbox"]:
        """The project's sandboxes whose metadata has every given pair.

        Args:
            metadata: required labels, e.g. ``{"user": "alice"}``.
            state: states to include (``"running"``, ``["running",
                "stopped"]``, ``"all"``); default: starting, running and
                paused.
        """
        c = client or default_client()
        out: List["Sandbox"] = []
        after: Optional[str] = None
        while True:  # a page at a time, oldest first
            try:
                data = c._request("GET", "/v1/sandboxes", params=list_params(metadata, state, after)).json()
            except PandaStackError as e:
                if not unpaged_server(e, after):
                    raise
                data = c._request("GET", "/v1/sandboxes", params=list_params(metadata, state, paged=False)).json()
            out += [cls(d, c) for d in data.get("sandboxes") or []]
            after = next_page(data, after)
            if after is None:
                return out

    def refresh(self) -> "Sandbox":
        """Fetch the sandbox's current state from the server; returns self."""
        self._update(self._client._request("GET", sandbox_path(self.id)).json())
        return self

    def is_running(self) -> bool:
        """Ask the server whether the sandbox is running now."""
        try:
            return self.refresh().state == "running"
        except NotFoundError:
            return False

    def kill(self) -> None:
        """Stop the sandbox and delete everything of it. Killing a sandbox
        that is already gone is not an error."""
        try:
            self._client._request("DELETE", sandbox_path(self.id))
        except NotFoundError:
            pass
        self._data["state"] = "stopped"
        self._data.setdefault("stop_reason", "killed")

    def terminal(self, cols: int = 80, rows: int = 24) -> "Terminal":
        """Open an interactive shell on a real terminal in the sandbox (see
        :class:`pandastack.terminal.Terminal`); needs the ``terminal`` extra (``websockets``)."""
        from .terminal import Terminal

        return Terminal(self._client, self.id, cols, rows)

    def set_ttl(self, seconds: int) -> None:
        """Make the sandbox expire ``seconds`` from now (not from its
        creation); updates :attr:`expires_at`."""
        self._update(self._client._request("PATCH", sandbox_path(self.id), json={"ttl_seconds": int(seconds)}).json())

    def set_idle_timeout(self, seconds: int) -> None:
        """Set the seconds idle after which the server suspends it (0: never);
        updates :attr:`idle_timeout_seconds`."""
        self._update(self._client._request("PATCH", sandbox_path(self.id), json={"idle_timeout_seconds": int(seconds)}).json())

    # ----- network -------------------------------------------------------

    def set_network(
        self,
        allow_internet_access: Union[bool, Mapping[str, Any]] = False,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
    ) -> None:
        """Replace the sandbox's egress policy; it takes effect at once.
        ``allow_out`` (IPs, CIDRs, domains, ``*.domain``) wins over
        ``deny_out`` (IPs, CIDRs). Without ``allow_internet_access=True``
        only ``allow_out`` is reachable, as in the API (a ``deny_out`` needs
        it). The policy may also be one mapping, as ``create(network=...)``
        takes it. A rejected policy changes nothing.

        Raises:
            InvalidRequestError: a malformed entry (named by its index).
            NetworkDeniedError: an entry inside the platform deny set.
        """
        body = set_network_body(allow_internet_access, allow_out, deny_out)
        self._update(self._client._request("PUT", sandbox_path(self.id, "/network"), json=body).json())

    def network_log(self) -> List[Dict[str, Any]]:
        """The sandbox's egress log, oldest first: DNS answers,
        connections through NAT or the domain proxy, and connects the
        firewall refused (time, address, port, domain, bytes each way,
        allowed, rule)."""
        return list(self._client._request("GET", sandbox_path(self.id, "/network/log")).json().get("entries") or [])

    def stats(self) -> SandboxStats:
        """The memory, CPU time and disk the sandbox uses now, and its
        limits. A paused sandbox uses none and reports zeros (the look does
        not wake it; its disk figures are None); a stopped one raises
        :class:`SandboxStoppedError`."""
        return SandboxStats.from_dict(self._client._request("GET", sandbox_path(self.id, "/stats")).json())

    def get_url(self, port: int, token: bool = True, ttl_seconds: Optional[int] = None) -> str:
        """The URL of a server listening on ``port`` (on 0.0.0.0) inside
        the sandbox, through the server's port proxy. With ``token`` (the
        default) it carries an expiring token and opens in a browser with no
        header; without, requests to it need the API key."""
        if not token:
            return self._client.api_url + port_path(self.id, port)
        body = {} if ttl_seconds is None else {"ttl_seconds": int(ttl_seconds)}
        return str(self._client._request("POST", port_path(self.id, port) + "token", json=body).json()["url"])

    def set_timeout(self, seconds: int) -> None:
        """Alias of :meth:`set_ttl`, under the name E2B's SDK uses."""
        self.set_ttl(seconds)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    # ----- commands ------------------------------------------------------

    @overload
    def exec(
        self,
        cmd: Command,
        timeout: Optional[float] = ...,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Optional[Union[str, bytes]] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        background: Literal[False] = ...,
    ) -> ExecResult: ...

    @overload
    def exec(
        self,
        cmd: Command,
        timeout: Optional[float] = ...,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Optional[Union[str, bytes]] = ...,
        on_stdout: Optional[OutputHandler] = ...,
        on_stderr: Optional[OutputHandler] = ...,
        *,
        background: Literal[True],
    ) -> CommandHandle: ...

    def exec(
        self,
        cmd: Command,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Union[str, bytes]] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        background: bool = False,
    ) -> Union[ExecResult, CommandHandle]:
        """Run one command and wait for it to exit, or, with
        ``background=True``, start it and return a :class:`CommandHandle`
        at once.

        Args:
            cmd: a shell command line (run with ``bash -c``) or a list of
                program and arguments (run without a shell).
            timeout: seconds before its whole process tree is killed
                (server default 60; none for a background command); the
                result then has ``timed_out=True``.
            env: extra environment variables.
            cwd: working directory (default ``/home/user``).
            stdin: text written to its standard input (closed after, except
                for a background command: feed it more with
                :meth:`CommandHandle.send_stdin`).
            on_stdout, on_stderr: called with each chunk of output as it is
                produced; giving either streams the command's output. With
                ``background=True`` give them to :meth:`CommandHandle.wait`.
            background: start the command and return without waiting; its
                output is kept by the server (the latest of it, in at most
                4 MiB of memory: less when it comes a line at a time while
                someone follows it).

        Returns:
            An :class:`ExecResult` (a non-zero exit status is not an error),
            or a :class:`CommandHandle` for a background command.

        Raises:
            CommandNotFoundError: ``cmd`` is a list whose program is missing.
            SandboxStoppedError: the sandbox has stopped (killed, expired, ...).
            SandboxUnavailableError: the sandbox does not answer for now (retry).
        """
        if background:
            if on_stdout is not None or on_stderr is not None:
                raise TypeError("on_stdout/on_stderr go to CommandHandle.wait() for a background command")
            body = exec_body(cmd, timeout, env, cwd, stdin)
            body["background"] = True
            data = self._client._request("POST", sandbox_path(self.id, "/exec"), json=body).json()
            return CommandHandle(self, ProcessInfo.from_dict(data))
        body = exec_body(cmd, timeout, env, cwd, stdin)
        path = sandbox_path(self.id, "/exec")
        read = read_timeout(timeout, EXEC_DEFAULT_TIMEOUT)
        if on_stdout is None and on_stderr is None:
            return ExecResult.from_dict(self._client._request("POST", path, json=body, timeout=read).json())
        parser = ExecStreamParser()
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr}
        accept = STREAM_MEDIA_TYPE + ", application/x-ndjson"
        with self._client._stream("POST", path, json=body, headers={"Accept": accept}, timeout=read) as resp:
            if resp.headers.get("content-type", "").startswith(STREAM_MEDIA_TYPE):
                frames = FrameDecoder()
                for chunk in resp.iter_bytes():
                    for action in frames.actions(parser, chunk):
                        _dispatch(action, handlers)
                    if parser.result is not None:
                        break
                if parser.result is None:
                    frames.finish()
            else:  # a server older than the binary stream
                for line in resp.iter_lines():
                    if not line.strip():
                        continue
                    action = parser.feed(line)
                    if action is not None:
                        _dispatch(action, handlers)
                    if parser.result is not None:
                        break
        return parser.finish()

    def list_processes(self) -> List[ProcessInfo]:
        """The sandbox's background processes, oldest first: the running
        ones and the last 64 that ended."""
        data = self._client._request("GET", sandbox_path(self.id, "/processes")).json()
        return [ProcessInfo.from_dict(d) for d in data.get("processes") or []]

    def connect_process(self, pid: int) -> CommandHandle:
        """A :class:`CommandHandle` for the background process ``pid``
        (started by anyone, e.g. in an earlier program).

        Raises:
            NotFoundError: no such background process.
        """
        for p in self.list_processes():
            if p.pid == pid:
                return CommandHandle(self, p)
        raise NotFoundError(f"no background process {pid} in sandbox {self.id}", code="not_found", status=404)

    def kill_process(self, pid: int) -> None:
        """SIGKILL the background process ``pid`` and everything it
        started."""
        self._client._request("POST", sandbox_path(self.id, f"/processes/{int(pid)}/kill"))

    def kill_all_processes(self) -> ProcessesKilled:
        """SIGKILL every process of the sandbox user but the code contexts'
        kernels, which keep their state: commands, background processes,
        terminals and what cells started (a fork bomb too; it cannot fork
        its way out). Processes run as root are left. The way out of a
        sandbox whose process table a runaway filled."""
        data = self._client._request("POST", sandbox_path(self.id, "/processes/kill")).json()
        return ProcessesKilled.from_dict(data)

    # ----- code ----------------------------------------------------------

    def create_code_context(
        self,
        language: str = "python",
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        auto_restart: Optional[bool] = None,
    ) -> "CodeContext":
        """Start a persistent kernel (like a Jupyter notebook's) in the
        sandbox. Variables, imports and the working directory persist
        between :meth:`CodeContext.run_code` calls.

        Args:
            language: ``"python"`` (IPython), ``"bash"``, ``"javascript"``
                or ``"typescript"`` (Deno), ``"r"`` (IRkernel) or ``"java"``
                (JJava).
            cwd: the kernel's working directory (default ``/home/user``).
            env: environment variables of the kernel.
            auto_restart: if the kernel dies (crash, ``os._exit``, out of
                memory), the next run restarts it and fails with
                ``KernelRestarted`` without running (its state is lost);
                later runs work. ``False``: runs fail with a ConflictError
                until :meth:`CodeContext.restart`. Default ``True``.
        """
        body: Dict[str, Any] = {"language": language}
        if cwd is not None:
            body["cwd"] = cwd
        if env is not None:
            body["env"] = dict(env)
        if auto_restart is not None:
            body["auto_restart"] = bool(auto_restart)
        data = self._client._request("POST", sandbox_path(self.id, "/contexts"), json=body).json()
        return CodeContext._from_dict(self, data)

    def list_code_contexts(self) -> List["CodeContext"]:
        """The sandbox's live code contexts, e.g. to reattach to them in a
        sandbox restored from a snapshot."""
        data = self._client._request("GET", sandbox_path(self.id, "/contexts")).json()
        return [CodeContext._from_dict(self, d) for d in data.get("contexts") or []]

    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        on_result: Optional[ResultHandler] = None,
        on_error: Optional[ErrorHandler] = None,
        env: Optional[Mapping[str, str]] = None,
        context: Optional[Union["CodeContext", str]] = None,
    ) -> Execution:
        """Run code in the sandbox's default context of ``language``
        (created on first use, then shared by every call), or in
        ``context``. See :meth:`CodeContext.run_code` for the arguments."""
        cid = context.id if isinstance(context, CodeContext) else context
        body = run_body(code, timeout, env, language=language if cid else (language or "python"), context_id=cid)
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr, "on_result": on_result, "on_error": on_error}
        return _run(self._client, sandbox_path(self.id, "/run_code"), body, timeout, handlers)

    # ----- snapshots -----------------------------------------------------

    def snapshot(self, metadata: Optional[Mapping[str, str]] = None) -> str:
        """Save the sandbox's whole state (memory, processes, code contexts,
        files) and return the snapshot's id (``snap_...``). The sandbox
        keeps running; a paused one stays paused. Restore it, from any
        process, with
        ``Sandbox.create(snapshot_id=...)``.

        Raises:
            ConflictError: an exec or a run is in progress (snapshots never
                wait for them).
            InsufficientStorageError: the server's disk is full.
        """
        return self.snapshot_info(metadata).id

    def snapshot_info(self, metadata: Optional[Mapping[str, str]] = None) -> SnapshotInfo:
        """Like :meth:`snapshot`, returning the whole snapshot record."""
        data = self._client._request("POST", sandbox_path(self.id, "/snapshots"), json=snapshot_body(metadata)).json()
        return SnapshotInfo.from_dict(data)

    @classmethod
    def list_snapshots(
        cls, metadata: Optional[Mapping[str, str]] = None, client: Optional[Client] = None
    ) -> List[SnapshotInfo]:
        """The project's snapshots whose metadata has every given pair."""
        c = client or default_client()
        data = c._request("GET", "/v1/snapshots", params=snapshot_params(metadata)).json()
        return [SnapshotInfo.from_dict(d) for d in data.get("snapshots") or []]

    @classmethod
    def get_snapshot(cls, snapshot_id: str, client: Optional[Client] = None) -> SnapshotInfo:
        """One snapshot; raises NotFoundError."""
        c = client or default_client()
        return SnapshotInfo.from_dict(c._request("GET", snapshot_path(snapshot_id)).json())

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, client: Optional[Client] = None) -> None:
        """Delete a snapshot and free its disk; sandboxes restored from it
        are not affected. Raises NotFoundError."""
        c = client or default_client()
        c._request("DELETE", snapshot_path(snapshot_id))

    def fork(
        self,
        count: int = 1,
        ttl_seconds: Optional[int] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[Mapping[str, Any]] = None,
    ) -> List["Sandbox"]:
        """Make ``count`` new sandboxes, each an independent copy of this one
        as it is now (warm kernels and their variables included). This one
        keeps running; a paused one (or one suspended for idleness) stays
        paused: the copies start from its paused image.

        Args:
            count: how many copies (the server allows 16 by default).
            ttl_seconds: TTL of each copy; default the server's.
            metadata: labels of each copy; default this sandbox's.
            network: egress policy of each copy, in force from its first
                instant, as ``create(network=...)`` takes it; default this
                sandbox's.
        """
        data = self._client._request("POST", sandbox_path(self.id, "/fork"), json=fork_body(count, ttl_seconds, metadata, network)).json()
        return [type(self)(d, self._client) for d in data.get("sandboxes") or []]

    def pause(self) -> None:
        """Checkpoint the sandbox to disk and free its memory and CPU; its
        state becomes ``"paused"``. Its TTL keeps counting. While paused,
        requests answer :class:`ConflictError` unless it was created with
        ``auto_resume=True``."""
        self._update(self._client._request("POST", sandbox_path(self.id, "/pause")).json())

    def resume(self) -> None:
        """Bring a paused sandbox back, exactly as it was; its state becomes
        ``"running"``."""
        self._update(self._client._request("POST", sandbox_path(self.id, "/resume")).json())


class CodeContext:
    """A persistent kernel in a sandbox. Each :meth:`run_code` is one
    notebook cell: state carries over from one call to the next.

    Make one with :meth:`Sandbox.create_code_context`; reattach to an
    existing one with :meth:`connect` or :meth:`Sandbox.list_code_contexts`.
    """

    def __init__(
        self, sandbox: Sandbox, context_id: str, language: str = "python", cwd: str = "", auto_restart: bool = True
    ) -> None:
        self.sandbox = sandbox
        self.id = context_id
        self.language = language
        self.cwd = cwd
        #: Whether a run on a kernel that died restarts it first (and fails
        #: with ``KernelRestarted``); see :meth:`Sandbox.create_code_context`.
        self.auto_restart = auto_restart

    @classmethod
    def _from_dict(cls, sandbox: Sandbox, d: Mapping[str, Any]) -> "CodeContext":
        return cls(sandbox, *context_args(d))

    @classmethod
    def connect(cls, sandbox: Union[Sandbox, str], context_id: str, client: Optional[Client] = None) -> "CodeContext":
        """Reattach to a context by id, e.g. in a sandbox restored from a
        snapshot (contexts keep their ids).

        Args:
            sandbox: the Sandbox, or its id.
            context_id: the context's id (``ctx_...``).

        Raises:
            NotFoundError: no such sandbox, or no such context in it.
        """
        sb = sandbox if isinstance(sandbox, Sandbox) else Sandbox.connect(sandbox, client=client)
        for ctx in sb.list_code_contexts():
            if ctx.id == context_id:
                return ctx
        raise NotFoundError(f"code context {context_id} not found in sandbox {sb.id}", code="not_found", status=404)

    def __repr__(self) -> str:
        return f"CodeContext(id={self.id!r}, language={self.language!r}, sandbox_id={self.sandbox.id!r})"

    def run_code(
        self,
        code: str,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        on_result: Optional[ResultHandler] = None,
        on_error: Optional[ErrorHandler] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """Run code as the next cell of this kernel and return its outcome.

        An exception in the code does not raise here: it is in
        ``Execution.error``. Charts (``plt.show()``) and rich values
        (a DataFrame as the last expression) come back in
        ``Execution.results`` and ``Execution.png``.

        Args:
            code: the source to run.
            timeout: seconds before the kernel is interrupted (server
                default 300); the Execution's error is then
                ``TimeoutError`` and earlier variables survive.
            on_stdout, on_stderr: called with each chunk of output as it
                is printed.
            on_result: called with each :class:`Result` as it is produced.
            on_error: called with the :class:`ExecutionError`, if any.
            env: environment variables for this cell only.

        Giving any callback streams the run: callbacks are called in
        order, as the kernel produces output, before this returns.

        Raises:
            ConflictError: the context is busy running another cell.
            NotFoundError: the context was closed.
            SandboxStoppedError: the sandbox has stopped (killed, expired, ...).
            SandboxUnavailableError: the sandbox does not answer for now (retry).
        """
        body = run_body(code, timeout, env)
        handlers = {"on_stdout": on_stdout, "on_stderr": on_stderr, "on_result": on_result, "on_error": on_error}
        return _run(self.sandbox.client, context_path(self.sandbox.id, self.id, "/run"), body, timeout, handlers)

    def interrupt(self) -> None:
        """Interrupt the cell running now (like Ctrl-C); the kernel lives on."""
        self.sandbox.client._request("POST", context_path(self.sandbox.id, self.id, "/interrupt"))

    def restart(self) -> None:
        """Restart the kernel: every variable and import is lost; the id stays."""
        d = self.sandbox.client._request("POST", context_path(self.sandbox.id, self.id, "/restart")).json()
        self.language = str(d.get("language") or self.language)
        self.cwd = str(d.get("cwd") or self.cwd)

    def close(self) -> None:
        """Shut the kernel down. Closing a context that is already gone (or
        whose sandbox is gone: killed, or stopped by its TTL or a failure)
        is not an error."""
        try:
            self.sandbox.client._request("DELETE", context_path(self.sandbox.id, self.id))
        except (NotFoundError, SandboxStoppedError):
            pass


class Files:
    """The files of a sandbox, as ``sandbox.files``. Relative paths are taken
    from ``/home/user``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def _path(self, sub: str = "") -> str:
        return sandbox_path(self._sandbox.id, "/files" + sub)

    def write(self, path: str, data: Union[bytes, bytearray, memoryview, str, IO[bytes]]) -> FileInfo:
        """Write ``data`` to ``path``, replacing the file atomically and
        creating missing parent directories. ``str`` is written as UTF-8; a
        binary file object is streamed."""
        content: Any
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = _iter_file(data)
        else:
            raise TypeError(f"data must be bytes, str or a binary file object, got {type(data).__name__}")
        r = self._sandbox.client._request("PUT", self._path(), params={"path": path}, content=content, headers=headers)
        return FileInfo.from_dict(r.json())

    def read(self, path: str) -> bytes:
        """The whole content of the file at ``path``. For big files prefer
        :meth:`download`, which never holds the file in memory."""
        return self._sandbox.client._request("GET", self._path(), params={"path": path}).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The content of the file at ``path``, decoded."""
        return self.read(path).decode(encoding)

    def upload(self, local_path: PathLike, remote_path: str) -> FileInfo:
        """Stream a local file into the sandbox, chunk by chunk."""
        size = os.path.getsize(local_path)
        with open(local_path, "rb") as f:
            r = self._sandbox.client._request(
                "PUT",
                self._path(),
                params={"path": remote_path},
                content=_iter_file(f),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            )
        return FileInfo.from_dict(r.json())

    def download(self, remote_path: str, local_path: PathLike) -> int:
        """Stream a file of the sandbox to ``local_path``, chunk by chunk.
        Returns the number of bytes written. A failed download leaves no
        partial file behind."""
        n = 0
        tmp = f"{os.fspath(local_path)}.part"
        try:
            with self._sandbox.client._stream("GET", self._path(), params={"path": remote_path}) as resp:
                with open(tmp, "wb") as f:
                    for chunk in resp.iter_bytes(FILE_CHUNK):
                        f.write(chunk)
                        n += len(chunk)
            os.replace(tmp, local_path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return n

    def list(self, path: str = ".") -> List[FileInfo]:
        """The entries of the directory at ``path``, sorted by name."""
        data = self._sandbox.client._request("GET", self._path("/list"), params={"path": path}).json()
        return [FileInfo.from_dict(d) for d in data.get("files") or []]

    def stat(self, path: str) -> FileInfo:
        """Describe the file at ``path`` (a symlink itself, not its target).

        Raises:
            NotFoundError: nothing at ``path``.
        """
        return FileInfo.from_dict(self._sandbox.client._request("GET", self._path("/stat"), params={"path": path}).json())

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``. A sandbox that is gone raises
        :class:`NotFoundError`, as every other call on it does."""
        try:
            self.stat(path)
            return True
        except NotFoundError:
            # The same 404 says "no such sandbox": ask which it was.
            self._sandbox.client._request("GET", sandbox_path(self._sandbox.id))
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file, symlink or empty directory; a non-empty directory
        needs ``recursive=True`` (else :class:`ConflictError`)."""
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        self._sandbox.client._request("DELETE", self._path(), params=params)

    def mkdir(self, path: str) -> FileInfo:
        """Create a directory and its missing parents (like ``mkdir -p``)."""
        return FileInfo.from_dict(self._sandbox.client._request("POST", self._path("/mkdir"), params={"path": path}).json())

    def watch_dir(self, path: str, on_event: Optional[Callable[[FileEvent], Any]] = None, recursive: bool = False) -> WatchHandle:
        """Watch the directory at ``path`` (and with ``recursive=True`` every
        directory beneath it, those made later too) and return once the watch
        is live: changes from then on come as :class:`FileEvent` objects, from
        :meth:`WatchHandle.get_new_events` and to ``on_event`` (called on the
        watch's thread). Stop it with :meth:`WatchHandle.stop` or a ``with``
        block. A watched sandbox is not suspended for idleness.

        Raises:
            NotFoundError: no directory at ``path``.
            InvalidRequestError: ``path`` is a file.
        """
        return WatchHandle(self._sandbox.client, self._path("/watch"), _watch_params(path, recursive), on_event)

    def rename(self, old_path: str, new_path: str, overwrite: bool = False) -> FileInfo:
        """Move or rename a file, a directory (with its contents) or a
        symlink (itself), making missing parents of ``new_path``. An
        existing ``new_path`` raises :class:`ConflictError` unless
        ``overwrite=True`` (a file then replaces a file, a directory an empty
        directory). Returns what was moved, at its new path."""
        params = {"path": old_path, "to": new_path}
        if overwrite:
            params["overwrite"] = "true"
        return FileInfo.from_dict(self._sandbox.client._request("POST", self._path("/rename"), params=params).json())


def _iter_file(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = f.read(FILE_CHUNK)
        if not chunk:
            return
        yield chunk
