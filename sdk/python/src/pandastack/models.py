"""Plain data returned by the SDK: outcomes of code and commands, files,
templates. They hold no connection and can be pickled, compared and printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, TypedDict, Union

__all__ = [
    "Result",
    "Chart",
    "ChartElement",
    "Table",
    "Logs",
    "ProcessInfo",
    "ExecutionError",
    "Execution",
    "ExecResult",
    "FileInfo",
    "TemplateInfo",
    "SnapshotInfo",
    "parse_time",
]

_FRACTION = re.compile(r"(\.\d{1,6})\d*")


def _opt_int(value: Any) -> Optional[int]:
    """An optional integer of the API's JSON: absent or null stays None."""
    return None if value is None else int(value)


def parse_time(value: Optional[str]) -> Optional[datetime]:
    """Parse the server's RFC 3339 timestamps (nanosecond precision, ``Z``)
    into an aware :class:`datetime`; ``None`` stays ``None``."""
    if not value:
        return None
    s = value.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    s = _FRACTION.sub(lambda m: m.group(1).ljust(7, "0")[:7], s, count=1)
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


class ChartElement(TypedDict, total=False):
    """One element of a :class:`Chart`; which keys it has depends on the
    chart's type:

    - ``line``, ``scatter``: ``label`` and ``points``, a list of ``[x, y]``
      (x or y is an ISO 8601 string on a datetime axis, a category name on
      a categorical one);
    - ``bar``: ``label`` (the bar's category), ``value``, ``group`` (the
      series' legend label);
    - ``pie``: ``label``, ``angle`` (degrees), ``radius``;
    - ``box_and_whisker``: ``label``, ``min``, ``first_quartile``,
      ``median``, ``third_quartile``, ``max``, ``outliers``.
    """

    label: Optional[str]
    points: List[List[Any]]
    value: Optional[float]
    group: Optional[str]
    angle: Optional[float]
    radius: Optional[float]
    min: Optional[float]
    first_quartile: Optional[float]
    median: Optional[float]
    third_quartile: Optional[float]
    max: Optional[float]
    outliers: List[Optional[float]]


class Chart(TypedDict, total=False):
    """The structure of a displayed matplotlib figure (``Result.chart``),
    read from the figure itself in the code-interpreter template.

    ``type`` is ``line``, ``scatter``, ``bar``, ``pie``,
    ``box_and_whisker``, ``superchart`` (several axes: ``elements`` are
    Charts) or ``unknown``. Scales are ``linear``, ``log``, ``symlog``,
    ``logit``, ``datetime`` or ``categorical``. ``truncated`` is true when
    points or elements were left out (5000 points per line, 1000 elements).
    """

    type: str
    title: Optional[str]
    x_label: Optional[str]
    y_label: Optional[str]
    x_scale: str
    y_scale: str
    x_ticks: List[Any]
    x_tick_labels: List[str]
    y_ticks: List[Any]
    y_tick_labels: List[str]
    elements: List[Union[ChartElement, "Chart"]]
    truncated: bool


class Table(TypedDict, total=False):
    """A displayed pandas DataFrame or Series as JSON values
    (``Result.data``): at most 1000 rows and 200 columns, ``truncated``
    when cut. NaN is ``None``; timestamps are ISO 8601 strings."""

    kind: str  # "dataframe" or "series"
    columns: List[Any]
    dtypes: List[str]
    index: List[Any]
    index_name: Any
    name: Optional[str]  # a Series' name
    rows: List[List[Any]]
    total_rows: int
    total_columns: int
    truncated: bool


# The MIME-derived fields of a Result, in the order formats() reports them.
_RESULT_FORMATS = (
    "text",
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "json",
    "javascript",
    "plotly",
    "chart",
    "data",
)


@dataclass
class Result:
    """One rich output of a cell: the value of its last expression
    (``is_main_result``) or something it displayed (a chart from
    ``plt.show()``, ``display(df)``).

    Each field holds one representation of the same output, ``None`` when
    the kernel did not produce it. Binary formats (``png``, ``jpeg``,
    ``pdf``) are base64 strings; ``json`` and ``plotly`` are decoded JSON;
    ``extra`` maps any other MIME type to its data.
    """

    is_main_result: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Any = None
    javascript: Optional[str] = None
    plotly: Any = None
    chart: Optional[Chart] = None
    data: Optional[Table] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Result":
        """Build a Result from the API's JSON object."""
        kw: Dict[str, Any] = {name: d.get(name) for name in _RESULT_FORMATS}
        return cls(is_main_result=bool(d.get("is_main_result", False)), extra=dict(d.get("extra") or {}), **kw)

    def formats(self) -> List[str]:
        """The representations present, e.g. ``["text", "png"]``."""
        out = [name for name in _RESULT_FORMATS if getattr(self, name) is not None]
        return out + sorted(self.extra)

    def __str__(self) -> str:
        return self.text if self.text is not None else f"Result(formats={self.formats()})"

    # Let notebooks render a Result the way the sandbox's kernel did.
    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg

    def _repr_png_(self) -> Optional[str]:
        return self.png

    def _repr_jpeg_(self) -> Optional[str]:
        return self.jpeg

    def _repr_latex_(self) -> Optional[str]:
        return self.latex

    def _repr_json_(self) -> Any:
        return self.json

    def _repr_javascript_(self) -> Optional[str]:
        return self.javascript


@dataclass
class ExecutionError:
    """The exception a cell raised, as the kernel reported it.

    ``name`` is the exception's class (``"ZeroDivisionError"``), or one the
    server reports itself: ``"TimeoutError"`` (the cell ran past its
    timeout; the kernel was interrupted and keeps its state),
    ``"KernelDied"``, ``"SandboxError"``. ``traceback`` is plain text without
    ANSI colours.

    ``str(error)`` is the formatted traceback, which ends with
    ``"Name: value"``, so ``f"ERROR:\\n{ex.error}"`` reads like Python's own
    report.
    """

    name: str
    value: str = ""
    traceback: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExecutionError":
        """Build an ExecutionError from the API's JSON object."""
        return cls(name=str(d.get("name") or ""), value=str(d.get("value") or ""), traceback=str(d.get("traceback") or ""))

    def __str__(self) -> str:
        summary = f"{self.name}: {self.value}" if self.value else self.name
        tb = self.traceback.rstrip()
        if not tb:
            return summary
        # Kernels end the traceback with "Name: value"; make sure the name is
        # there even for errors the server made up (TimeoutError, KernelDied).
        if self.name and self.name not in tb:
            return f"{tb}\n{summary}"
        return tb


@dataclass(frozen=True)
class Logs:
    """``Execution.logs``: the name E2B's SDK uses for a run's output, each
    stream as a list of chunks. Here each holds the whole text as one chunk
    (none when empty), so ``"".join(ex.logs.stdout) == ex.stdout``."""

    stdout: List[str]
    stderr: List[str]


@dataclass
class Execution:
    """The outcome of running code in a code context.

    Attributes:
        stdout: everything the cell printed to standard output.
        stderr: everything it printed to standard error (warnings too).
        results: its rich outputs in order; see :class:`Result`.
        error: ``None``, or the exception the cell raised.
        execution_count: the kernel's cell counter (``In [n]``).
        duration_ms: wall time of the run on the server.
    """

    stdout: str = ""
    stderr: str = ""
    results: List[Result] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    duration_ms: int = 0
    _text: Optional[str] = field(default=None, repr=False)
    _png: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Execution":
        """Build an Execution from the API's JSON object."""
        err = d.get("error")
        return cls(
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            results=[Result.from_dict(r) for r in d.get("results") or []],
            error=ExecutionError.from_dict(err) if isinstance(err, Mapping) else None,
            execution_count=d.get("execution_count"),
            duration_ms=int(d.get("duration_ms") or 0),
            _text=d.get("text") or None,
            _png=d.get("png") or None,
        )

    @property
    def text(self) -> Optional[str]:
        """The text form of the cell's last expression (like ``Out[n]``), or
        ``None`` when the cell ended with a statement."""
        if self._text is not None:
            return self._text
        for r in self.results:
            if r.is_main_result and r.text is not None:
                return r.text
        return None

    @property
    def png(self) -> Optional[str]:
        """The cell's first PNG image (e.g. from ``plt.show()``) as a base64
        string, or ``None``."""
        if self._png is not None:
            return self._png
        for r in self.results:
            if r.png:
                return r.png
        return None

    @property
    def logs(self) -> Logs:
        """The output under E2B's name: ``logs.stdout`` and ``logs.stderr``
        (lists of chunks); an alias of :attr:`stdout` and :attr:`stderr`."""
        return Logs(stdout=[self.stdout] if self.stdout else [], stderr=[self.stderr] if self.stderr else [])

    @property
    def main_result(self) -> Optional[Result]:
        """The Result of the cell's last expression, if any."""
        for r in self.results:
            if r.is_main_result:
                return r
        return None


@dataclass
class ExecResult:
    """The outcome of a one-shot command (:meth:`Sandbox.exec`).

    A non-zero exit or a timeout is not an exception: check ``exit_code``
    and ``timed_out``.
    """

    stdout: str
    stderr: str
    exit_code: int
    duration_ms: int
    timed_out: bool = False
    signal: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExecResult":
        """Build an ExecResult from the API's JSON object."""
        return cls(
            stdout=d.get("stdout") or "",
            stderr=d.get("stderr") or "",
            exit_code=int(d.get("exit_code", -1)),
            duration_ms=int(d.get("duration_ms") or 0),
            timed_out=bool(d.get("timed_out", False)),
            signal=d.get("signal") or None,
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
        )

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ProcessInfo:
    """A background process (``sandbox.exec(cmd, background=True)``), as
    the server last described it."""

    pid: int
    cmd: str
    cwd: str
    started_at: Optional[datetime]
    running: bool
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    timed_out: bool = False
    output_dropped: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        """Build a ProcessInfo from the API's JSON object."""
        code = d.get("exit_code")
        return cls(
            pid=int(d.get("pid") or 0),
            cmd=d.get("cmd") or "",
            cwd=d.get("cwd") or "",
            started_at=parse_time(d.get("started_at")),
            running=bool(d.get("running", False)),
            exit_code=None if code is None else int(code),
            signal=d.get("signal") or None,
            timed_out=bool(d.get("timed_out", False)),
            output_dropped=int(d.get("output_dropped") or 0),
        )


@dataclass
class ProcessesKilled:
    """What :meth:`Sandbox.kill_all_processes` did: ``killed`` processes,
    and ``remaining``, those still found at the end (each sent a kill
    then; 0 unless they forked faster than the kill went round for 10 s:
    call it again)."""

    killed: int
    remaining: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessesKilled":
        """Build it from the API's JSON object."""
        return cls(killed=int(d.get("killed") or 0), remaining=int(d.get("remaining") or 0))


@dataclass
class FileEvent:
    """One change in a watched directory (:meth:`Files.watch_dir`).

    ``type`` is ``"create"`` (made, or moved here), ``"write"`` (contents
    changed; writes in a row come as one), ``"remove"``, ``"rename"`` (moved
    away from ``path``; its new name, if watched, comes as a ``"create"``),
    ``"chmod"`` (permissions, owner or times) or ``"overflow"`` (changes were
    lost: list the directory again). ``name`` is ``path`` relative to the
    watched directory."""

    type: str
    path: str
    name: str
    is_dir: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FileEvent":
        """Build a FileEvent from one line of the watch stream."""
        return cls(type=d.get("type", ""), path=d.get("path", ""), name=d.get("name", ""), is_dir=bool(d.get("is_dir")))


@dataclass
class FileInfo:
    """A file or directory inside a sandbox."""

    name: str
    path: str
    type: str  # "file", "dir", "symlink" or "other"
    size: int
    mode: str  # permission bits in octal, e.g. "0644"
    mod_time: Optional[datetime]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FileInfo":
        """Build a FileInfo from the API's JSON object."""
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            type=d.get("type", ""),
            size=int(d.get("size") or 0),
            mode=d.get("mode", ""),
            mod_time=parse_time(d.get("mod_time")),
        )

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"


@dataclass
class PoolInfo:
    """A template's pool: sandboxes restored ahead of creates."""

    ready: int
    size: int
    pss_bytes: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PoolInfo":
        """Build a PoolInfo from the API's JSON object."""
        return cls(ready=int(d.get("ready") or 0), size=int(d.get("size") or 0), pss_bytes=int(d.get("pss_bytes") or 0))


@dataclass
class TemplateInfo:
    """A template the server has built and can create sandboxes from."""

    name: str
    hash: str
    size_bytes: int
    cpu: int
    memory_mb: int
    built_at: Optional[datetime]
    build_seconds: float = 0.0
    description: str = ""
    #: Default size in MiB of a sandbox's own disk (0: writes stay in memory).
    disk_mb: int = 0
    #: Creates restore a warm snapshot (the default Python context already up).
    warm: bool = False
    #: Why its warm-up failed on the server, when it did (its creates boot cold).
    warm_error: str = ""
    #: Sandboxes restored ahead of creates, or None when the template has no pool.
    pool: Optional[PoolInfo] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TemplateInfo":
        """Build a TemplateInfo from the API's JSON object."""
        pool = d.get("pool")
        return cls(
            name=d.get("name", ""),
            hash=d.get("hash", ""),
            size_bytes=int(d.get("size_bytes") or 0),
            cpu=int(d.get("cpu") or 0),
            memory_mb=int(d.get("memory_mb") or 0),
            built_at=parse_time(d.get("built_at")),
            build_seconds=float(d.get("build_seconds") or 0),
            description=d.get("description") or "",
            disk_mb=int(d.get("disk_mb") or 0),
            warm=bool(d.get("warm")),
            warm_error=d.get("warm_error") or "",
            pool=PoolInfo.from_dict(pool) if isinstance(pool, Mapping) else None,
        )


@dataclass
class SandboxStats:
    """What a running sandbox uses now (``Sandbox.stats()``)."""

    #: Host memory charged to the sandbox: what its memory limit counts.
    memory_bytes: int
    memory_limit_bytes: int
    #: CPU time since it started, or was last resumed or restored.
    cpu_seconds: float
    #: CPUs it may use.
    cpu_limit: int
    sampled_at: Optional[datetime]
    #: What is used of its disk, as ``df /`` shows it inside, and the
    #: disk's size (its ``disk_mb``); None while it is paused, or when its
    #: agent is of a build that cannot say.
    disk_bytes: Optional[int] = None
    disk_limit_bytes: Optional[int] = None

    @property
    def memory_used_fraction(self) -> float:
        """memory_bytes over memory_limit_bytes (0 without a limit)."""
        return self.memory_bytes / self.memory_limit_bytes if self.memory_limit_bytes else 0.0

    @property
    def disk_used_fraction(self) -> Optional[float]:
        """disk_bytes over disk_limit_bytes; None when either is unknown."""
        if self.disk_bytes is None or not self.disk_limit_bytes:
            return None
        return self.disk_bytes / self.disk_limit_bytes

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SandboxStats":
        """Build a SandboxStats from the API's JSON object."""
        return cls(
            memory_bytes=int(d.get("memory_bytes") or 0),
            memory_limit_bytes=int(d.get("memory_limit_bytes") or 0),
            cpu_seconds=float(d.get("cpu_seconds") or 0),
            cpu_limit=int(d.get("cpu_limit") or 0),
            sampled_at=parse_time(d.get("sampled_at")),
            disk_bytes=_opt_int(d.get("disk_bytes")),
            disk_limit_bytes=_opt_int(d.get("disk_limit_bytes")),
        )


@dataclass
class SnapshotInfo:
    """A saved sandbox state: memory, processes (code contexts) and files."""

    id: str
    sandbox_id: str
    template: str
    size_bytes: int
    created_at: Optional[datetime]
    metadata: Dict[str, str] = field(default_factory=dict)
    cpu: int = 0
    memory_mb: int = 0
    #: The egress policy a restore applies unless it gives one
    #: (``allow_internet_access``, ``allow_out``, ``deny_out``); None on a
    #: server without networking, and for snapshots taken before it was kept.
    network: Optional[Dict[str, Any]] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SnapshotInfo":
        """Build a SnapshotInfo from the API's JSON object."""
        return cls(
            id=d.get("id", ""),
            sandbox_id=d.get("sandbox_id", ""),
            template=d.get("template", ""),
            size_bytes=int(d.get("size_bytes") or 0),
            created_at=parse_time(d.get("created_at")),
            metadata=dict(d.get("metadata") or {}),
            cpu=int(d.get("cpu") or 0),
            memory_mb=int(d.get("memory_mb") or 0),
            network=dict(d["network"]) if isinstance(d.get("network"), Mapping) else None,
        )
