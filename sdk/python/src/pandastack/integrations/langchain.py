"""LangChain / LangGraph integration (the SDK's ``langchain`` extra).

:class:`PandaStackPythonTool` is a LangChain tool that runs Python in a
PandaStack sandbox, for LangGraph's prebuilt agent or any tool-calling
chain::

    from langgraph.prebuilt import create_react_agent
    from pandastack.integrations.langchain import PandaStackPythonTool

    tool = PandaStackPythonTool()
    agent = create_react_agent(model, [tool])
    agent.invoke({"messages": [("user", "Plot 1000 normal samples")]})
    tool.close()

Its ``response_format`` is ``"content_and_artifact"``: the ``ToolMessage``'s
content is the recipe's text (``ERROR:`` and the traceback, or stdout,
``[stderr]``, ``[result]``, ``[chart]``), which the model reads; its
``artifact`` is the list of charts as LangChain image content blocks
(``{"type": "image", "base64": ..., "mime_type": "image/png"}``), which the
application gets and the model does not (hand them to a multimodal model as
message content if it should see them).
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, Type

try:
    from langchain_core.callbacks import CallbackManagerForToolRun
    from langchain_core.messages.content import create_image_block
    from langchain_core.tools import BaseTool, ToolException
    from pydantic import BaseModel, Field, PrivateAttr
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"pandastack.integrations.langchain needs langchain-core (>= 1.0): pip install 'langchain-core>=1,<2' ({e})"
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
    SandboxLostError,
    chart_pngs,
    format_execution,
)

__all__ = ["PandaStackPythonTool", "RunPythonInput", "chart_blocks"]


class RunPythonInput(BaseModel):
    """The tool's arguments."""

    code: str = Field(description=CODE_DESCRIPTION)


def chart_blocks(ex: Execution) -> List[Dict[str, Any]]:
    """The charts of an Execution as LangChain image content blocks."""
    return [dict(create_image_block(base64=b64, mime_type="image/png")) for b64 in chart_pngs(ex)]


class PandaStackPythonTool(BaseTool):
    """Run Python in a persistent PandaStack sandbox kernel.

    The sandbox and its kernel are created on the first call and kept, so
    state carries over between calls; each instance has its own (give
    parallel agents one each). :meth:`close` kills the sandbox.

    Args:
        sandbox, sandbox_id: run in this existing sandbox instead of
            booting one, in its default Python context (the one
            ``Sandbox.run_code`` uses) or in ``context_id``; :meth:`close`
            then leaves the sandbox alone.
        template, ttl_seconds, metadata: of the sandbox the tool boots.
        client: the server and key; default from the environment.
        timeout: seconds a call may run before the kernel is interrupted.
        name, description: what the model sees (LangChain's usual fields).
    """

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
    args_schema: Type[BaseModel] = RunPythonInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    _kernel: SandboxKernel = PrivateAttr()

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
        **kwargs: Any,
    ) -> None:
        # A SandboxLostError goes to the model as the tool's answer (it says
        # the next call starts afresh), rather than ending the graph's run.
        kwargs.setdefault("handle_tool_error", True)
        super().__init__(**kwargs)
        self._kernel = SandboxKernel(
            sandbox=sandbox,
            sandbox_id=sandbox_id,
            context_id=context_id,
            template=template,
            ttl_seconds=ttl_seconds,
            metadata=metadata,
            client=client,
            timeout=timeout,
        )

    def _run(
        self, code: str, run_manager: Optional[CallbackManagerForToolRun] = None
    ) -> Tuple[str, List[Dict[str, Any]]]:
        try:
            ex = self._kernel.run(code)
        except SandboxLostError as e:
            raise ToolException(str(e)) from e
        return format_execution(ex), chart_blocks(ex)

    @property
    def kernel(self) -> SandboxKernel:
        return self._kernel

    @property
    def sandbox(self) -> Sandbox:
        """The tool's sandbox (booted now if it was not yet)."""
        return self._kernel.sandbox

    def close(self) -> None:
        """Kill the tool's sandbox; one it was attached to keeps running. A
        later call starts afresh. Idempotent."""
        self._kernel.close()
