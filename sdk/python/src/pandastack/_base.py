"""What the sync and async front ends share: request bodies, paths, the
sandbox record, and the parsers of the two NDJSON streams. No I/O here."""

from __future__ import annotations

import codecs
import json
import struct
from datetime import datetime
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from .exceptions import InvalidRequestError, PandaStackError, StreamError, error_from_response
from .models import ExecResult, Execution, ExecutionError, Result, parse_time

# Server-side defaults (see the OpenAPI document); the HTTP read timeout of a
# request that runs something is its own timeout plus this margin, so the
# server's answer (a timed-out result) arrives before the client gives up.
EXEC_DEFAULT_TIMEOUT = 60.0
RUN_DEFAULT_TIMEOUT = 300.0
TIMEOUT_MARGIN = 60.0

# Status of each code, for errors that arrive inside a 200 stream.
_STATUS_OF_CODE = {
    "invalid_request": 400,
    "command_not_found": 400,
    "unauthorized": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "template_not_built": 409,
    "payload_too_large": 413,
    "internal": 500,
    "sandbox_unavailable": 503,
    "sandbox_stopped": 410,
    "timeout": 504,
    "insufficient_storage": 507,
    "insufficient_memory": 503,
}

Command = Union[str, Sequence[str]]


def sandbox_path(sandbox_id: str, sub: str = "") -> str:
    return "/v1/sandboxes/" + quote(sandbox_id, safe="") + sub


def context_path(sandbox_id: str, context_id: str, sub: str = "") -> str:
    return sandbox_path(sandbox_id, "/contexts/" + quote(context_id, safe="") + sub)


def read_timeout(op_timeout: Optional[float], server_default: float) -> float:
    return float(op_timeout if op_timeout is not None else server_default) + TIMEOUT_MARGIN


def _str_map(name: str, m: Optional[Mapping[str, Any]]) -> Optional[Dict[str, str]]:
    if m is None:
        return None
    if not isinstance(m, Mapping):
        raise TypeError(f"{name} must be a mapping of strings, got {type(m).__name__}")
    for k, v in m.items():
        if v is None:
            raise InvalidRequestError(f"{name}[{k!r}] is None; give a string", code="invalid_request")
    return {str(k): str(v) for k, v in m.items()}


def _int(name: str, v: Any) -> int:
    """v as a whole number, as the server takes it: True, 10.5 or "ten" are refused rather than
    sent as 1, 10 or a bare ValueError."""
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise InvalidRequestError(f"{name} must be a whole number, got {v!r}", code="invalid_request")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"{name} must be a whole number, got {v!r}", code="invalid_request") from None


def create_body(
    template: Optional[str],
    ttl_seconds: Optional[int],
    metadata: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    snapshot_id: Optional[str],
    cpu: Optional[int],
    memory_mb: Optional[int],
    auto_resume: Optional[bool] = None,
    idle_timeout_seconds: Optional[int] = None,
    network: Optional[Mapping[str, Any]] = None,
    disk_mb: Optional[int] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if network is not None:
        body["network"] = network_body(**network)
    if snapshot_id:
        # A restored sandbox takes its template from the snapshot.
        body["snapshot_id"] = snapshot_id
    elif template:
        body["template"] = template
    if ttl_seconds is not None:
        body["ttl_seconds"] = _int("ttl_seconds", ttl_seconds)
    if metadata is not None:
        body["metadata"] = _str_map("metadata", metadata)
    if env is not None:
        body["env"] = _str_map("env", env)
    if cpu is not None:
        body["cpu"] = _int("cpu", cpu)
    if memory_mb is not None:
        body["memory_mb"] = _int("memory_mb", memory_mb)
    if disk_mb is not None:
        body["disk_mb"] = _int("disk_mb", disk_mb)
    if auto_resume is not None:
        body["auto_resume"] = bool(auto_resume)
    if idle_timeout_seconds is not None:
        body["idle_timeout_seconds"] = _int("idle_timeout_seconds", idle_timeout_seconds)
    return body


def fork_body(
    count: int,
    ttl_seconds: Optional[int],
    metadata: Optional[Mapping[str, str]],
    network: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"count": _int("count", count)}
    if ttl_seconds is not None:
        body["ttl_seconds"] = _int("ttl_seconds", ttl_seconds)
    if metadata is not None:
        body["metadata"] = _str_map("metadata", metadata)
    if network is not None:
        body["network"] = network_body(**network)
    return body


def snapshot_body(metadata: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    return {} if metadata is None else {"metadata": _str_map("metadata", metadata)}


def snapshot_path(snapshot_id: str) -> str:
    return "/v1/snapshots/" + quote(snapshot_id, safe="")


def snapshot_params(metadata: Optional[Mapping[str, str]]) -> List[Tuple[str, str]]:
    return [(f"metadata.{k}", str(v)) for k, v in (metadata or {}).items()]


def list_params(
    metadata: Optional[Mapping[str, str]], state: Optional[Union[str, Sequence[str]]], after: Optional[str] = None, paged: bool = True
) -> List[Tuple[str, str]]:
    """The query of one page of a list of sandboxes (LIST_PAGE of them,
    after the place ``after``, an earlier page's ``next``, names), or of
    the whole list when not ``paged``."""
    params = [(f"metadata.{k}", str(v)) for k, v in (metadata or {}).items()]
    if state:
        params.append(("state", state if isinstance(state, str) else ",".join(state)))
    if paged:
        params.append(("limit", str(LIST_PAGE)))
    if after:
        params.append(("after", after))
    return params


def unpaged_server(err: PandaStackError, after: Optional[str]) -> bool:
    """Whether err is a server from before pages refusing the first page's
    limit (it lists everything at once)."""
    return after is None and err.code == "invalid_request" and '"limit"' in err.message


def next_page(data: Mapping[str, Any], after: Optional[str]) -> Optional[str]:
    """The after of the page that follows data (a page read after
    ``after``), or None after the last; a server that would have the list
    go on for ever is an error."""
    nxt = data.get("next")
    if nxt and (nxt == after or not data.get("sandboxes")):
        raise PandaStackError(f"the server answered next {nxt!r} to the page after {after!r}, which would never end", code="internal")
    return nxt or None


# How many sandboxes a list asks the server for at a time.
LIST_PAGE = 500


def exec_body(
    cmd: Command,
    timeout: Optional[float],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    stdin: Optional[Union[str, bytes]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        if not cmd:
            raise InvalidRequestError("cmd must not be empty", code="invalid_request")
        body["cmd"] = cmd
    else:
        argv = [str(a) for a in cmd]
        if not argv:
            raise InvalidRequestError("cmd must not be an empty list", code="invalid_request")
        body["argv"] = argv
    if timeout is not None:
        body["timeout_seconds"] = float(timeout)
    if env is not None:
        body["env"] = _str_map("env", env)
    if cwd is not None:
        body["cwd"] = cwd
    if stdin is not None:
        if isinstance(stdin, bytes):
            try:
                stdin = stdin.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequestError(
                    "stdin must be UTF-8 text; write binary input to a file (sandbox.files.write) and read it from there",
                    code="invalid_request",
                ) from None
        body["stdin"] = stdin
    return body


def context_args(d: Mapping[str, Any]) -> Tuple[str, str, str, bool]:
    """A context's id, language, cwd and auto_restart, as the server describes it."""
    return (
        str(d["id"]),
        str(d.get("language") or "python"),
        str(d.get("cwd") or ""),
        bool(d.get("auto_restart", True)),
    )


def run_body(
    code: str,
    timeout: Optional[float],
    env: Optional[Mapping[str, str]],
    language: Optional[str] = None,
    context_id: Optional[str] = None,
) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    body: Dict[str, Any] = {"code": code}
    if timeout is not None:
        body["timeout_seconds"] = float(timeout)
    if env is not None:
        body["env"] = _str_map("env", env)
    if language is not None:
        body["language"] = language
    if context_id is not None:
        body["context_id"] = context_id
    return body


def network_body(
    allow_internet_access: bool = False,
    allow_out: Optional[Sequence[str]] = None,
    deny_out: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """The JSON of a network policy (see docs/network.md). Without
    ``allow_internet_access=True`` only ``allow_out`` is reachable, as in the
    API: a policy is never more open than it says."""
    if not isinstance(allow_internet_access, bool):
        raise TypeError("allow_internet_access must be a bool, not %s" % type(allow_internet_access).__name__)
    for name, entries in (("allow_out", allow_out), ("deny_out", deny_out)):
        if isinstance(entries, (str, bytes)):
            raise TypeError("%s must be a list of entries, not a single string" % name)
    return {
        "allow_internet_access": bool(allow_internet_access),
        "allow_out": [str(e) for e in allow_out or []],
        "deny_out": [str(e) for e in deny_out or []],
    }


def set_network_body(
    policy: Union[bool, Mapping[str, Any]],
    allow_out: Optional[Sequence[str]],
    deny_out: Optional[Sequence[str]],
) -> Dict[str, Any]:
    """The body of set_network: a policy given as a mapping, as
    ``Sandbox.create(network=...)`` takes it, or as its arguments."""
    if isinstance(policy, Mapping):
        if allow_out is not None or deny_out is not None:
            raise TypeError("give the policy as one mapping or as arguments, not both")
        return network_body(**policy)
    return network_body(policy, allow_out, deny_out)


def port_path(sandbox_id: str, port: int) -> str:
    return sandbox_path(sandbox_id, "/ports/%d/" % int(port))


class SandboxRecord:
    """The server's view of a sandbox, refreshed by every call that returns
    it. Shared by :class:`Sandbox` and :class:`AsyncSandbox`."""

    _data: Dict[str, Any]

    def _update(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    @property
    def id(self) -> str:
        """The sandbox's id, ``sbx_`` and 16 characters."""
        return str(self._data["id"])

    @property
    def sandbox_id(self) -> str:
        """Same as :attr:`id`."""
        return self.id

    @property
    def template(self) -> str:
        """Name of the template it was created from."""
        return str(self._data.get("template", ""))

    @property
    def network(self) -> Optional[Dict[str, Any]]:
        """Its egress policy (``allow_internet_access``, ``allow_out``,
        ``deny_out``), or None when the server runs without networking."""
        n = self._data.get("network")
        return dict(n) if n is not None else None

    @property
    def state(self) -> str:
        """``"starting"``, ``"running"``, ``"paused"`` or ``"stopped"``, as of
        the last answer about this sandbox (call ``refresh()`` to update)."""
        return str(self._data.get("state", ""))

    @property
    def metadata(self) -> Dict[str, str]:
        """The labels given at creation."""
        return dict(self._data.get("metadata") or {})

    @property
    def cpu(self) -> int:
        """CPUs it may use."""
        return int(self._data.get("cpu") or 0)

    @property
    def memory_mb(self) -> int:
        """Its memory limit in MiB."""
        return int(self._data.get("memory_mb") or 0)

    @property
    def auto_resume(self) -> bool:
        """Whether any request resumes it while paused (else they answer
        :class:`ConflictError`)."""
        return bool(self._data.get("auto_resume", False))

    @property
    def idle_timeout_seconds(self) -> int:
        """Seconds idle (nothing running, no request, CPU quiet) after which
        the server suspends it to disk; the next request resumes it. 0: never."""
        return int(self._data.get("idle_timeout_seconds") or 0)

    @property
    def pause_reason(self) -> Optional[str]:
        """While paused: ``"idle"`` when the server suspended it for
        idleness, ``"memory"`` when it did so because its host ran short of
        memory (either way any request resumes it), else None."""
        return self._data.get("pause_reason") or None

    @property
    def created_at(self) -> Optional[datetime]:
        return parse_time(self._data.get("created_at"))

    @property
    def expires_at(self) -> Optional[datetime]:
        """When the server stops it unless :meth:`set_ttl` extends it."""
        return parse_time(self._data.get("expires_at"))

    @property
    def stopped_at(self) -> Optional[datetime]:
        return parse_time(self._data.get("stopped_at"))

    @property
    def stop_reason(self) -> Optional[str]:
        """Once stopped: ``expired``, ``killed``, ``died``, ``out_of_memory``,
        ``pids_limit``, ``lost`` or ``start_failed``."""
        return self._data.get("stop_reason") or None

    def to_dict(self) -> Dict[str, Any]:
        """The sandbox as the API last described it."""
        return dict(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, template={self.template!r}, state={self.state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxRecord) and type(other) is type(self) and other.id == self.id

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.id))


def parse_line(line: str) -> Dict[str, Any]:
    try:
        ev = json.loads(line)
    except ValueError as e:
        raise StreamError(f"bad event in the server's stream: {line[:200]!r}", code="stream_error") from e
    if not isinstance(ev, dict):
        raise StreamError(f"bad event in the server's stream: {line[:200]!r}", code="stream_error")
    return ev


def stream_failure(err: Any) -> PandaStackError:
    """The exception for an ``error`` event that reports a server failure
    (not a cell's exception). The server nests it as in its error answers,
    ``{"error": {"code", "message"}}``; a flat ``{"code", "message"}`` is
    accepted too."""
    if isinstance(err, Mapping) and isinstance(err.get("error"), Mapping):
        err = err["error"]
    if not isinstance(err, Mapping):
        return StreamError(f"the server reported an error mid-stream: {err!r}", code="stream_error")
    code = err.get("code") or "internal"
    message = err.get("message") or "the server reported an error mid-stream"
    exc = error_from_response(code, message, _STATUS_OF_CODE.get(code))
    exc.status = None  # the HTTP status was 200: the stream had started
    return exc


# An action a stream asks the caller to perform: (callback name, argument).
Action = Tuple[str, Any]


class CodeStreamParser:
    """Folds the NDJSON events of a run (``stdout``, ``stderr``, ``result``,
    ``error``, ``execution``) into callback actions and the final Execution."""

    def __init__(self) -> None:
        self.execution: Optional[Execution] = None
        self._saw_error = False

    def feed(self, line: str) -> Optional[Action]:
        ev = parse_line(line)
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            return ("on_" + kind, ev.get("data") or "")
        if kind == "result" and isinstance(ev.get("result"), Mapping):
            return ("on_result", Result.from_dict(ev["result"]))
        if kind == "error":
            err = ev.get("error")
            if isinstance(err, Mapping) and "name" in err:
                self._saw_error = True
                return ("on_error", ExecutionError.from_dict(err))
            raise stream_failure(err)
        if kind == "execution" and isinstance(ev.get("execution"), Mapping):
            self.execution = Execution.from_dict(ev["execution"])
        return None  # unknown event types are ignored: newer servers may add some

    def finish(self) -> Tuple[Execution, List[Action]]:
        """The Execution, and the actions still owed: ``on_error`` for an
        error that only the final execution reported."""
        if self.execution is None:
            raise StreamError("the run's stream ended without its execution event (connection cut?)", code="stream_error")
        owed: List[Action] = []
        if self.execution.error is not None and not self._saw_error:
            owed.append(("on_error", self.execution.error))
        return self.execution, owed


class ExecStreamParser:
    """Folds the NDJSON events of a streamed exec into callback actions and
    the final ExecResult."""

    def __init__(self) -> None:
        self._out: List[str] = []
        self._err: List[str] = []
        self.result: Optional[ExecResult] = None
        # Frames may cut a UTF-8 character; these keep the pieces.
        self._dec_out = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._dec_err = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, line: str) -> Optional[Action]:
        ev = parse_line(line)
        kind = ev.get("type")
        if kind == "stdout":
            data = ev.get("data") or ""
            self._out.append(data)
            return ("on_stdout", data)
        if kind == "stderr":
            data = ev.get("data") or ""
            self._err.append(data)
            return ("on_stderr", data)
        if kind == "exit":
            self.result = ExecResult(
                stdout="".join(self._out),
                stderr="".join(self._err),
                exit_code=int(ev.get("exit_code", -1)),
                duration_ms=int(ev.get("duration_ms") or 0),
                timed_out=bool(ev.get("timed_out", False)),
                signal=ev.get("signal") or None,
            )
        elif kind == "error":
            raise stream_failure(ev.get("error"))
        return None

    def feed_frame(self, kind: int, payload: bytes) -> Optional[Action]:
        """Like feed, for one frame of the binary stream (STREAM_MEDIA_TYPE)."""
        if kind == FRAME_STDOUT:
            data = self._dec_out.decode(payload)
            self._out.append(data)
            return ("on_stdout", data) if data else None
        if kind == FRAME_STDERR:
            data = self._dec_err.decode(payload)
            self._err.append(data)
            return ("on_stderr", data) if data else None
        try:
            ev = json.loads(payload)
        except ValueError:
            raise StreamError(f"bad {'exit' if kind == FRAME_EXIT else 'error'} frame in the exec stream: {payload[:200]!r}", code="stream_error")
        if not isinstance(ev, dict):
            raise StreamError(f"bad frame in the exec stream: {payload[:200]!r}", code="stream_error")
        ev["type"] = "exit" if kind == FRAME_EXIT else "error"
        if kind == FRAME_EXIT:  # a character cut at the very end
            self._out.append(self._dec_out.decode(b"", final=True))
            self._err.append(self._dec_err.decode(b"", final=True))
        return self.feed(json.dumps(ev))

    def finish(self) -> ExecResult:
        if self.result is None:
            raise StreamError("the command's stream ended without its exit event (connection cut?)", code="stream_error")
        return self.result


# The binary exec stream: frames of a type byte, a big-endian uint32 length
# and the payload (stdout/stderr bytes, exit/error JSON).
STREAM_MEDIA_TYPE = "application/vnd.pandastack.stream"
FRAME_STDOUT, FRAME_STDERR, FRAME_EXIT, FRAME_ERROR = 1, 2, 3, 4
FRAME_MAX_PAYLOAD = 1 << 20
_FRAME_HEADER = struct.Struct(">BI")


class FrameDecoder:
    """Cuts the bytes of a binary exec stream, fed in pieces of any size,
    into (type, payload) frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Tuple[int, bytes]]:
        self._buf += data
        frames: List[Tuple[int, bytes]] = []
        pos = 0
        while len(self._buf) - pos >= _FRAME_HEADER.size:
            kind, n = _FRAME_HEADER.unpack_from(self._buf, pos)
            if kind not in (FRAME_STDOUT, FRAME_STDERR, FRAME_EXIT, FRAME_ERROR):
                raise StreamError(f"bad frame in the exec stream: unknown type {kind}", code="stream_error")
            if n > FRAME_MAX_PAYLOAD:
                raise StreamError(f"bad frame in the exec stream: {n} bytes, more than the {FRAME_MAX_PAYLOAD} allowed", code="stream_error")
            end = pos + _FRAME_HEADER.size + n
            if len(self._buf) < end:
                break
            frames.append((kind, bytes(self._buf[pos + _FRAME_HEADER.size : end])))
            pos = end
        del self._buf[:pos]
        return frames

    def actions(self, parser: ExecStreamParser, data: bytes) -> Iterator[Action]:
        """Feeds data, then each whole frame to parser; yields the callback
        actions, up to the exit frame."""
        for kind, payload in self.feed(data):
            action = parser.feed_frame(kind, payload)
            if action is not None:
                yield action
            if parser.result is not None:
                return

    def finish(self) -> None:
        """Raises if the stream stopped inside a frame."""
        if self._buf:
            raise StreamError("the command's stream was cut inside a frame (connection cut?)", code="stream_error")


FILE_CHUNK = 1 << 20
