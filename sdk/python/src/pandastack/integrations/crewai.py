"""CrewAI integration (the SDK's ``crewai`` extra).

:class:`PandaStackPythonTool` is a CrewAI tool that runs Python in a
PandaStack sandbox::

    from crewai import Agent, Crew, Task
    from pandastack.integrations.crewai import PandaStackPythonTool

    tool = PandaStackPythonTool()                       # boots its own sandbox
    # tool = PandaStackPythonTool(sandbox_id="sbx_...")  # or works in yours
    analyst = Agent(role="Data analyst", goal="...", backstory="...", tools=[tool])
    Crew(agents=[analyst], tasks=[Task(description="...", expected_output="...", agent=analyst)]).kickoff()
    tool.close()

By default the tool is persistent: one kernel for every call, so variables
carry over; with ``persistent=False`` each call runs in a fresh kernel of
the same sandbox. It answers with the recipe's text (``ERROR:`` and the
traceback, or stdout, ``[stderr]``, ``[result]``, ``[chart]``); the charts of
the last call are in :attr:`PandaStackPythonTool.last_charts`. CrewAI's
result cache is off for this tool: running the same code twice may give
different results.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Type

try:
    from crewai.tools import BaseTool
    from pydantic import BaseModel, Field, PrivateAttr
    try:
        from crewai.types.callback import SerializableCallable
    except ImportError:  # pragma: no cover - older crewai
        SerializableCallable = Any  # type: ignore[misc]
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"pandastack.integrations.crewai needs crewai (>= 1.15): pip install 'crewai>=1.15,<2' ({e})"
    ) from e

from ..client import Client
from ..models import Execution
from ..sandbox import Sandbox
from ._kernel import (
    CODE_DESCRIPTION,
    DEFAULT_TEMPLATE,
    DEFAULT_TTL_SECONDS,
    TOOL_DESCRIPTION,
    TOOL_NAME,
    SandboxKernel,
    chart_pngs,
    format_execution,
)

__all__ = ["PandaStackPythonTool", "RunPythonInput"]


class RunPythonInput(BaseModel):
    """The tool's arguments."""

    code: str = Field(description=CODE_DESCRIPTION)


def never_cache(_args: Any = None, _result: Any = None) -> bool:
    """CrewAI cache policy of the tool: code has side effects, never reuse a result."""
    return False


class PandaStackPythonTool(BaseTool):
    """Run Python in a PandaStack sandbox kernel.

    Fields (CrewAI tools are pydantic models):
        sandbox_id: work in this existing sandbox instead of booting one, in
            its default Python context (the one ``Sandbox.run_code`` uses;
            in a sandbox restored from a snapshot its variables are back);
            :meth:`close` then leaves the sandbox running.
        context_id: with ``sandbox_id``, the code context to use instead.
        persistent: one kernel for every call (default); ``False`` runs each
            call in a new kernel, closed after it.
        template, ttl_seconds, metadata: of the sandbox the tool boots.
        timeout: seconds a call may run before the kernel is interrupted.

    Keyword arguments that are not fields: ``sandbox`` (a :class:`Sandbox`
    to work in) and ``client`` (the server and key; default from the
    environment).
    """

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
    args_schema: Type[BaseModel] = RunPythonInput
    cache_function: SerializableCallable = never_cache

    sandbox_id: Optional[str] = None
    context_id: Optional[str] = None
    persistent: bool = True
    template: str = DEFAULT_TEMPLATE
    ttl_seconds: Optional[int] = DEFAULT_TTL_SECONDS
    metadata: Optional[Dict[str, str]] = None
    timeout: Optional[float] = None

    _kernel: SandboxKernel = PrivateAttr()
    _last_execution: Optional[Execution] = PrivateAttr(default=None)

    def __init__(self, *, sandbox: Optional[Sandbox] = None, client: Optional[Client] = None, **data: Any) -> None:
        if sandbox is not None:
            data.setdefault("sandbox_id", sandbox.id)
        super().__init__(**data)
        self._kernel = SandboxKernel(
            sandbox=sandbox,
            sandbox_id=self.sandbox_id,
            context_id=self.context_id,
            template=self.template,
            ttl_seconds=self.ttl_seconds,
            metadata=self.metadata,
            client=client,
            timeout=self.timeout,
        )

    def _run(self, code: str) -> str:
        ex = self._kernel.run(code) if self.persistent else self._kernel.run_fresh(code)
        self._last_execution = ex
        return format_execution(ex)

    @property
    def kernel(self) -> SandboxKernel:
        return self._kernel

    @property
    def sandbox(self) -> Sandbox:
        """The tool's sandbox (booted now if it was not yet)."""
        return self._kernel.sandbox

    @property
    def last_execution(self) -> Optional[Execution]:
        """The whole outcome of the last call."""
        return self._last_execution

    @property
    def last_charts(self) -> List[str]:
        """The PNGs (base64) of the last call's charts."""
        return chart_pngs(self._last_execution) if self._last_execution else []

    def close(self) -> None:
        """Kill the tool's sandbox; one it was attached to keeps running. A
        later call starts afresh. Idempotent."""
        self._kernel.close()
