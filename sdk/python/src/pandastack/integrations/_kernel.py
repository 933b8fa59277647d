"""What every framework integration shares: a sandbox kernel created on
first use, and the text an agent reads back from one run. Imports no agent
framework (the framework modules import this one, never the reverse)."""

from __future__ import annotations

import base64
import json
import re
import threading
from typing import List, Mapping, Optional

from ..client import Client
from ..exceptions import NotFoundError, SandboxStoppedError, SandboxUnavailableError
from ..models import Execution, Result
from ..sandbox import CodeContext, Sandbox

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TTL_SECONDS",
    "TOOL_NAME",
    "TOOL_DESCRIPTION",
    "CODE_DESCRIPTION",
    "CHART_MARKER",
    "SandboxKernel",
    "SandboxLostError",
    "OUTPUT_HEAD",
    "OUTPUT_TAIL",
    "format_execution",
    "chart_pngs",
    "png_bytes",
]

DEFAULT_TEMPLATE = "code-interpreter"
DEFAULT_TTL_SECONDS = 3600

TOOL_NAME = "run_python"
# The recipe's docstring: the model reads it to know when and how to call the tool.
TOOL_DESCRIPTION = (
    "Execute Python in a secure, isolated sandbox kernel and return its output. "
    "State (variables, imports, DataFrames) persists across calls within this "
    "session, so build up your analysis incrementally. Use matplotlib/plotly "
    "normally — charts are captured automatically; do not savefig or write files."
)
CODE_DESCRIPTION = "The Python source to execute in the sandbox."
CHART_MARKER = "[chart] PNG produced (available as ex.png on the Execution)"

# What of a long stdout or stderr goes into the text the model reads: its
# head and its tail. The server keeps 1 MiB of each per run, about 260,000
# tokens, more than most models' context; the rest stays on the Execution.
OUTPUT_HEAD = 96 << 10
OUTPUT_TAIL = 32 << 10


def _bounded(text: str) -> str:
    """text, or its head and tail with a note of what was left out between."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= OUTPUT_HEAD + OUTPUT_TAIL:
        return text
    head = data[:OUTPUT_HEAD].decode("utf-8", "ignore")
    tail = data[-OUTPUT_TAIL:].decode("utf-8", "ignore")
    left = len(data) - len(head.encode("utf-8", "surrogatepass")) - len(tail.encode("utf-8", "surrogatepass"))
    note = (
        f"[… {left} bytes of output left out here; to see them, write the output "
        "to a file and read parts of it, or print less]"
    )
    return f"{head}\n{note}\n{tail}"


def format_execution(ex: Execution) -> str:
    """The recipe's contract: what the model reads after running code.

    An exception gives ``ERROR:``, the traceback (which names the exception),
    what the cell printed before it, what it showed with ``display()``, and
    ``[stderr]`` with what went to stderr (often the reason, as a failed
    ``subprocess.run`` gives it). Otherwise the parts present, in order and
    separated by blank lines: stdout, ``[stderr]`` and what went to stderr,
    ``[display]`` and the text of each thing shown with ``display()``,
    ``[result] <text of the last expression>`` (unless the cell printed it
    last, as ``print(x); x`` does), and :data:`CHART_MARKER` when the cell
    produced a PNG; or ``(no output)``. The text of a result is its Markdown,
    LaTeX or JSON when its plain text is only a repr (``<IPython.core.display.
    Markdown object>``); a chart's repr is left out. (The recipe's own
    version leaves the result out whenever its text appears anywhere in
    stdout, so ``print(100); 1`` loses the ``1``; this one does not.)

    stdout and stderr are given as a terminal would show them: a line
    rewritten with ``\\r`` (a progress bar's frames) keeps its last state
    only, and colour codes are dropped. A stdout, stderr, traceback or
    result longer than :data:`OUTPUT_HEAD` plus :data:`OUTPUT_TAIL` bytes
    keeps its head and tail with a note; the Execution keeps it all.
    """
    stdout, stderr = _as_shown(ex.stdout or ""), _as_shown(ex.stderr or "")
    # Bounded as a whole: a cell may show hundreds of things.
    shown = "\n\n".join(f"[display] {t}" for t in (_result_text(r) for r in ex.results if not r.is_main_result) if t)
    shown = _bounded(shown) if shown else ""
    if ex.error:
        text = f"ERROR:\n{_bounded(str(ex.error))}\n\nstdout:\n{_bounded(stdout)}".strip()
        if shown:
            text += f"\n\n{shown}"
        if stderr:
            text += f"\n\n[stderr]\n{_bounded(stderr.rstrip())}"
        return text
    parts = []
    if stdout:
        parts.append(_bounded(stdout.rstrip()))
    if stderr:
        parts.append(f"[stderr]\n{_bounded(stderr.rstrip())}")
    if shown:
        parts.append(shown)
    main = ex.main_result
    value = _result_text(main) if main is not None else ex.text
    if value and not _printed_last(value, stdout):
        parts.append(f"[result] {_bounded(value)}")
    if ex.png:
        parts.append(CHART_MARKER)
    return "\n\n".join(parts) or "(no output)"


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_REPR = re.compile(r"^<[\w.]+(?: object| at 0x[0-9a-f]+|[^<>]*)>$")


def _as_shown(text: str) -> str:
    """text as a terminal leaves it: colour and other escape codes dropped,
    and each line rewritten with carriage returns (tqdm, pip) at its last
    state."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" not in text:
        return text
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        frames = [f for f in line.split("\r") if f]
        lines.append(frames[-1] if frames else "")
    return "\n".join(lines)


def _result_text(r: Optional[Result]) -> Optional[str]:
    """What a model can read of a result: its plain text, unless that is
    only a repr (``<IPython.core.display.Markdown object>``, ``<Figure size
    640x480 with 1 Axes>``), then its Markdown, LaTeX or JSON; None for a
    chart or an image alone."""
    if r is None:
        return None
    text = r.text
    if text and not _REPR.match(text.strip()):
        return text
    if r.markdown:
        return r.markdown
    if r.latex:
        return r.latex
    if r.json is not None:
        return json.dumps(r.json, ensure_ascii=False)
    if r.png or r.jpeg or r.svg:
        return None
    return text


def _printed_last(text: str, stdout: str) -> bool:
    """Whether stdout ends with text as whole lines."""
    out = stdout.rstrip("\n")
    return out.endswith(text) and (len(out) == len(text) or out[-len(text) - 1] == "\n")


def chart_pngs(ex: Execution) -> List[str]:
    """Every PNG the cell produced (base64), in order: one per chart."""
    pngs = [r.png for r in ex.results if r.png]
    if not pngs and ex.png:
        pngs = [ex.png]
    return pngs


def png_bytes(b64: str) -> bytes:
    """Decode one of :func:`chart_pngs`."""
    return base64.b64decode(b64)


class SandboxLostError(SandboxStoppedError, SandboxUnavailableError):
    """The sandbox a :class:`SandboxKernel` booted has stopped (its TTL ran
    out, or it was killed from elsewhere), and its state with it. The kernel
    has forgotten it: the next run boots a new sandbox. The message says so
    in words an agent can act on (run its setup again). It is both a
    :class:`SandboxStoppedError` and, as before that class existed, a
    :class:`SandboxUnavailableError`."""


class SandboxKernel:
    """A sandbox and the Python kernel in it that runs an agent's code, made
    on first use and reused by every run, so state carries over like in a
    notebook.

    Either the kernel boots its own sandbox (``template``, ``ttl_seconds``,
    ``metadata``), starts a code context in it, and :meth:`close` kills the
    sandbox; or it is attached to an existing one (``sandbox`` or
    ``sandbox_id``): runs then go to the context ``context_id``, else to the
    sandbox's default Python context (the one ``Sandbox.run_code`` uses,
    which a sandbox restored from a snapshot has back with its variables),
    and :meth:`close` leaves the sandbox and its contexts alone.

    Runs are serialized: a context runs one cell at a time, and parallel tool
    calls of one agent would otherwise get ConflictError. Thread-safe.
    """

    def __init__(
        self,
        *,
        sandbox: Optional[Sandbox] = None,
        sandbox_id: Optional[str] = None,
        context_id: Optional[str] = None,
        template: str = DEFAULT_TEMPLATE,
        ttl_seconds: Optional[int] = DEFAULT_TTL_SECONDS,
        metadata: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
        timeout: Optional[float] = None,
    ) -> None:
        if sandbox is not None and sandbox_id is not None and sandbox.id != sandbox_id:
            raise ValueError("give sandbox or sandbox_id, not both")
        sandbox_id = sandbox.id if sandbox is not None else sandbox_id
        if context_id is not None and sandbox_id is None:
            raise ValueError("context_id needs sandbox or sandbox_id")
        self._sandbox = sandbox
        self._sandbox_id = sandbox_id
        self.attached = sandbox_id is not None
        self._context_id = context_id
        self._context: Optional[CodeContext] = None
        self.template = template
        self.ttl_seconds = ttl_seconds
        self.metadata = dict(metadata) if metadata else None
        self.client = client
        self.timeout = timeout
        self._lock = threading.RLock()

    @property
    def started(self) -> bool:
        """Whether the sandbox was booted or connected to (no request made)."""
        return self._sandbox is not None

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox, booted (or connected to) on first access."""
        with self._lock:
            if self._sandbox is None:
                if self.attached:
                    assert self._sandbox_id is not None
                    self._sandbox = Sandbox.connect(self._sandbox_id, client=self.client)
                else:
                    self._sandbox = Sandbox.create(
                        template=self.template,
                        ttl_seconds=self.ttl_seconds,
                        metadata=self.metadata,
                        client=self.client,
                    )
            return self._sandbox

    @property
    def context(self) -> Optional[CodeContext]:
        """The code context that runs the code, started on first access; or
        ``None`` for the default Python context of an attached sandbox."""
        with self._lock:
            if self._context is None:
                sb = self.sandbox
                if self._context_id is not None:
                    self._context = CodeContext.connect(sb, self._context_id)
                elif not self.attached:
                    try:
                        self._context = sb.create_code_context(language="python")
                    except BaseException:
                        # A sandbox whose kernel will not start is of no use:
                        # do not leave it running until its TTL.
                        self._sandbox = None
                        try:
                            sb.kill()
                        except Exception:
                            pass
                        raise
            return self._context

    def run(self, code: str, timeout: Optional[float] = None) -> Execution:
        """Run ``code`` as the next cell of the persistent kernel.

        Raises:
            SandboxLostError: the sandbox this kernel booted has stopped
                (expired, or killed from elsewhere); the next run starts
                afresh in a new one. An attached sandbox that stopped raises
                the server's error as it is: it is not this kernel's to
                replace.
        """
        t = timeout if timeout is not None else self.timeout
        with self._lock:
            try:
                ctx = self.context
                if ctx is None:
                    return self.sandbox.run_code(code, language="python", timeout=t)
                return ctx.run_code(code, timeout=t)
            except (NotFoundError, SandboxStoppedError, SandboxUnavailableError) as e:
                self._raise_if_lost(e)
                raise

    def _raise_if_lost(self, e: "NotFoundError | SandboxStoppedError | SandboxUnavailableError") -> None:
        """Raise SandboxLostError for e if this kernel's own sandbox has
        stopped (and forget it); else return. Called with the lock held."""
        lost = self._lost()
        if lost is None:
            return
        raise SandboxLostError(
            f"the sandbox {lost} that ran this agent's code has stopped ({e.message}), and its "
            "variables, imports and files are gone; the next call runs in a new sandbox, so "
            "repeat any setup (imports, loading data) there",
            code=e.code,
            status=e.status,
        ) from e

    def _lost(self) -> Optional[str]:
        """After a run failed as not found or unavailable: the id of this
        kernel's own sandbox if it has stopped (it is then forgotten), else
        None. Called with the lock held."""
        sb = self._sandbox
        if sb is None or self.attached:
            return None
        try:
            if sb.is_running() or sb.state in ("starting", "paused"):
                return None
        except Exception:
            return None  # the server does not answer: nothing is known
        self._sandbox, self._context = None, None
        try:
            sb.kill()  # a stopped sandbox's record, gone with it
        except Exception:
            pass
        return sb.id

    def run_fresh(self, code: str, timeout: Optional[float] = None) -> Execution:
        """Run ``code`` in a new context of the sandbox, closed right after:
        nothing carries over to or from other runs."""
        with self._lock:
            try:
                ctx = self.sandbox.create_code_context(language="python")
            except (NotFoundError, SandboxStoppedError, SandboxUnavailableError) as e:
                self._raise_if_lost(e)
                raise
        try:
            return ctx.run_code(code, timeout=timeout if timeout is not None else self.timeout)
        except (NotFoundError, SandboxStoppedError, SandboxUnavailableError) as e:
            with self._lock:
                self._raise_if_lost(e)
            raise
        finally:
            try:
                ctx.close()
            except (NotFoundError, SandboxStoppedError, SandboxUnavailableError):
                pass  # gone with its sandbox

    def close(self) -> None:
        """Kill the sandbox if this kernel booted it; an attached sandbox and
        its contexts are left alone. The next run starts over in a new
        sandbox (or reconnects). Idempotent."""
        with self._lock:
            self._context = None
            sb = self._sandbox
            self._sandbox = None
            if sb is not None and not self.attached:
                sb.kill()
