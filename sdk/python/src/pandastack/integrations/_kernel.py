"""What every framework integration shares: a sandbox kernel created on
first use, and the text an agent reads back from one run. Imports no agent
framework (the framework modules import this one, never the reverse)."""

from __future__ import annotations

import base64
import threading
from typing import List, Mapping, Optional

from ..client import Client
from ..models import Execution
from ..sandbox import CodeContext, Sandbox

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TTL_SECONDS",
    "TOOL_NAME",
    "TOOL_DESCRIPTION",
    "CODE_DESCRIPTION",
    "CHART_MARKER",
    "SandboxKernel",
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


def format_execution(ex: Execution) -> str:
    """The recipe's contract: what the model reads after running code.

    An exception gives ``ERROR:``, the traceback (which names the exception)
    and what the cell printed before it. Otherwise the parts present, in
    order and separated by blank lines: stdout, ``[stderr]`` and what went to
    stderr, ``[result] <text of the last expression>`` (unless the cell
    printed it last, as ``print(x); x`` does), and :data:`CHART_MARKER` when
    the cell produced a PNG; or ``(no output)``. (The recipe's own version
    leaves the result out whenever its text appears anywhere in stdout, so
    ``print(100); 1`` loses the ``1``; this one does not.)
    """
    if ex.error:
        return f"ERROR:\n{ex.error}\n\nstdout:\n{ex.stdout}".strip()
    parts = []
    if ex.stdout:
        parts.append(ex.stdout.rstrip())
    if ex.stderr:
        parts.append(f"[stderr]\n{ex.stderr.rstrip()}")
    if ex.text and not _printed_last(ex.text, ex.stdout or ""):
        parts.append(f"[result] {ex.text}")
    if ex.png:
        parts.append(CHART_MARKER)
    return "\n\n".join(parts) or "(no output)"


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
        """Run ``code`` as the next cell of the persistent kernel."""
        t = timeout if timeout is not None else self.timeout
        with self._lock:
            ctx = self.context
            if ctx is None:
                return self.sandbox.run_code(code, language="python", timeout=t)
            return ctx.run_code(code, timeout=t)

    def run_fresh(self, code: str, timeout: Optional[float] = None) -> Execution:
        """Run ``code`` in a new context of the sandbox, closed right after:
        nothing carries over to or from other runs."""
        with self._lock:
            ctx = self.sandbox.create_code_context(language="python")
        try:
            return ctx.run_code(code, timeout=timeout if timeout is not None else self.timeout)
        finally:
            ctx.close()

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
