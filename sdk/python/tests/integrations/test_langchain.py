"""LangChain integration: LangGraph's prebuilt ReAct agent, driven by a
scripted chat model (a LangChain BaseChatModel with bind_tools), against the
real server."""

from __future__ import annotations

import base64
import warnings
from typing import Any, List, Optional

import pytest

pytestmark = pytest.mark.code_interpreter

pytest.importorskip("langchain_core")
pytest.importorskip("langgraph")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402

from langgraph.prebuilt import create_react_agent  # noqa: E402

from scripted import Script  # noqa: E402


@pytest.fixture(autouse=True)
def _code_interpreter(server):
    from conftest import require_code_interpreter

    require_code_interpreter(server)


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a Script and records the tools bound."""

    script: Any
    bound_tools: List[str] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: List[BaseMessage], stop: Optional[List[str]] = None, run_manager=None, **kwargs: Any):
        names = [t["function"]["name"] for t in kwargs.get("tools") or []]
        assert names == self.bound_tools, f"the model was called with tools {names}"
        return ChatResult(generations=[ChatGeneration(message=self.script.next(messages))])

    def bind_tools(self, tools, **kwargs: Any):
        formatted = [convert_to_openai_tool(t) for t in tools]
        self.bound_tools = [t["function"]["name"] for t in formatted]
        return self.bind(tools=formatted, **kwargs)


_ids = iter(range(1, 10_000))


def call(code: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": "run_python", "args": {"code": code}, "id": f"call_{next(_ids)}"}])


def last_tool_message(messages: List[BaseMessage]) -> ToolMessage:
    for m in reversed(messages):
        if isinstance(m, ToolMessage):
            return m
    raise AssertionError(f"no ToolMessage in the model input: {messages!r}")


def test_react_agent_keeps_state_reads_errors_and_gets_chart_artifacts():
    from pandastack.integrations.langchain import PandaStackPythonTool

    tool = PandaStackPythonTool(metadata={"suite": "integrations-langchain"})
    assert tool.name == "run_python" and tool.response_format == "content_and_artifact"
    script = Script(
        "langgraph",
        [
            call("import pandas as pd\ndf = pd.DataFrame({'n': [3, 4, 5]})\nprint(len(df))"),
            call("int(df['n'].sum())"),
            call("df['missing']"),
            call("import matplotlib.pyplot as plt\nplt.plot(df['n'])\nplt.show()\nprint('plotted')"),
            AIMessage(content="The sum of n is 12; the chart is attached."),
        ],
    )
    model = ScriptedChatModel(script=script)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated since LangGraph 1.0 (langchain.agents.create_agent), still supported
        agent = create_react_agent(model, [tool])
    try:
        out = agent.invoke({"messages": [("user", "Sum n and plot it.")]})
        script.assert_used_up()
        assert model.bound_tools == ["run_python"]
        messages = out["messages"]
        assert messages[-1].content == "The sum of n is 12; the chart is attached."

        inputs = script.inputs
        assert last_tool_message(inputs[1]).content == "3"
        # State carried over from call 1 to call 2.
        assert last_tool_message(inputs[2]).content == "[result] 12"
        err = last_tool_message(inputs[3])
        assert err.content.startswith("ERROR:\n"), err.content
        assert "KeyError" in err.content and "missing" in err.content
        assert err.artifact == []
        chart = last_tool_message(inputs[4])
        assert chart.content == "plotted\n\n[chart] PNG produced (available as ex.png on the Execution)"

        # The graph's own ToolMessage carries the chart as its artifact.
        tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
        assert len(tool_messages) == 4
        artifact = tool_messages[3].artifact
        assert isinstance(artifact, list) and len(artifact) == 1
        block = artifact[0]
        assert block["type"] == "image" and block["mime_type"] == "image/png"
        raw = base64.b64decode(block["base64"])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        assert all(m.artifact == [] for m in tool_messages[:3])
    finally:
        sb = tool.sandbox if tool.kernel.started else None
        tool.close()
    assert sb is not None and not sb.is_running()


def test_tool_attached_to_an_existing_sandbox_leaves_it_running(code_sandbox):
    from pandastack.integrations.langchain import PandaStackPythonTool

    code_sandbox.run_code("shared = 'set outside the agent'")  # the default Python context
    ctx = code_sandbox.create_code_context()
    ctx.run_code("private = 1")
    tool = PandaStackPythonTool(sandbox_id=code_sandbox.id)
    try:
        # It works in the sandbox's default Python context...
        msg = tool.invoke({"type": "tool_call", "id": "c1", "name": "run_python", "args": {"code": "shared"}})
        assert isinstance(msg, ToolMessage)
        assert msg.content == "[result] 'set outside the agent'"
    finally:
        tool.close()
    # ...and closing it leaves the sandbox and its contexts alone.
    assert code_sandbox.is_running()
    assert ctx.run_code("private").text == "1"
    with_ctx = PandaStackPythonTool(sandbox=code_sandbox, context_id=ctx.id)
    try:
        assert with_ctx.invoke({"code": "private + 1"}) == "[result] 2"
    finally:
        with_ctx.close()
    assert code_sandbox.is_running()


def test_tool_answers_when_its_sandbox_stopped_and_carries_on():
    """A sandbox the tool booted that was killed from elsewhere gives the
    model a tool message saying so (the graph's run died with NotFoundError),
    and the next call runs in a new sandbox."""
    from pandastack import Sandbox
    from pandastack.integrations.langchain import PandaStackPythonTool

    tool = PandaStackPythonTool()
    try:
        assert tool.invoke({"code": "x = 41; x + 1"}) == "[result] 42"
        first = tool.sandbox.id
        Sandbox.connect(first).kill()
        msg = tool.invoke({"type": "tool_call", "id": "c1", "name": "run_python", "args": {"code": "x + 1"}})
        assert isinstance(msg, ToolMessage) and msg.status == "error"
        assert f"the sandbox {first} that ran this agent's code has stopped" in msg.content
        out = tool.invoke({"code": "x + 1"})
        assert out.startswith("ERROR:") and "NameError" in out  # a new sandbox: x is gone
        assert tool.sandbox.id != first
    finally:
        tool.close()
