"""smolagents integration: real ToolCallingAgent and CodeAgent loops, driven
by a scripted model (a smolagents Model subclass), against the real server."""

from __future__ import annotations

import sys
import threading
from typing import Any, List

import pytest

pytestmark = pytest.mark.code_interpreter

smolagents = pytest.importorskip("smolagents")

import PIL.Image  # noqa: E402  (comes with smolagents)
from smolagents import CodeAgent, ToolCallingAgent, tool  # noqa: E402
from smolagents.models import (  # noqa: E402
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from pandastack import Sandbox  # noqa: E402
from scripted import Script  # noqa: E402


@pytest.fixture(autouse=True)
def _code_interpreter(server):
    from conftest import require_code_interpreter

    require_code_interpreter(server)


class ScriptedModel(Model):
    """A smolagents Model that answers from a Script."""

    def __init__(self, script: Script) -> None:
        super().__init__(model_id="scripted")
        self.script = script

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        return self.script.next(messages)


def call(name: str, **arguments: Any) -> ChatMessage:
    """The model's answer: one tool call."""
    call.n += 1
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[
            ChatMessageToolCall(
                id=f"call_{call.n}",
                type="function",
                function=ChatMessageToolCallFunction(name=name, arguments=arguments),
            )
        ],
    )


call.n = 0


def code(source: str) -> ChatMessage:
    """A CodeAgent's answer: a thought and a code block."""
    return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: next step.\n<code>\n{source}\n</code>")


def text_of(message: ChatMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(item.get("text", "") for item in message.content or [] if item.get("type") == "text")


def last_observation(messages: List[ChatMessage]) -> str:
    """The text of the last tool response in a model input."""
    for m in reversed(messages):
        if m.role == MessageRole.TOOL_RESPONSE:
            return text_of(m)
    raise AssertionError(f"no tool response in the model input: {messages!r}")


def images_in(messages: List[ChatMessage]) -> List[Any]:
    return [
        item["image"]
        for m in messages
        if not isinstance(m.content, str)
        for item in m.content or []
        if item.get("type") == "image"
    ]


def test_tool_calling_agent_keeps_state_reads_errors_and_sees_charts():
    from pandastack.integrations.smolagents import PandaStackPythonTool

    tool = PandaStackPythonTool(chart_images=True, metadata={"suite": "integrations-smolagents"})
    assert not tool.kernel.started  # nothing booted before the first call
    script = Script(
        "smolagents",
        [
            call("run_python", code="import numpy as np\nsamples = np.arange(10) * 2\nprint('defined')"),
            call("run_python", code="print(samples.sum())\nfloat(samples.mean())"),
            call("run_python", code="print('before')\nraise ValueError('bad sample size')"),
            call("run_python", code="import matplotlib.pyplot as plt\nplt.hist(samples)\nplt.show()"),
            call("final_answer", answer="the mean is 9.0"),
        ],
    )
    agent = ToolCallingAgent(
        tools=[tool], model=ScriptedModel(script), step_callbacks=[tool.add_chart_images], max_steps=8, verbosity_level=0
    )
    try:
        result = agent.run("Analyse the samples.")
        script.assert_used_up()
        assert result == "the mean is 9.0"

        inputs = script.inputs
        # Each call's answer is in the model's next input, in the recipe's format.
        assert last_observation(inputs[1]) == "Observation:\ndefined"
        # ...and the variable set in call 1 was still there in call 2.
        assert last_observation(inputs[2]) == "Observation:\n90\n\n[result] 9.0"
        err = last_observation(inputs[3])
        assert err.startswith("Observation:\nERROR:\n"), err
        assert "ValueError" in err and "bad sample size" in err
        assert err.endswith("stdout:\nbefore")
        chart = last_observation(inputs[4])
        assert chart == "Observation:\n[chart] PNG produced (available as ex.png on the Execution)"
        # The chart itself went to the model as an observation image, in
        # that input only.
        assert images_in(inputs[3]) == []
        imgs = images_in(inputs[4])
        assert len(imgs) == 1 and isinstance(imgs[0], PIL.Image.Image)
        assert imgs[0].format == "PNG" and imgs[0].width > 100 and imgs[0].height > 100
        chart_step = agent.memory.steps[4]  # steps[0] is the task
        assert chart_step.tool_calls[0].arguments["code"].endswith("plt.show()")
        assert len(chart_step.observations_images) == 1
    finally:
        sb = tool.sandbox if tool.kernel.started else None
        tool.close()
    assert sb is not None and not sb.is_running()


def test_run_python_is_lazy_persistent_and_closes():
    from pandastack.integrations import smolagents as integ
    from pandastack.integrations.smolagents import close, run_python

    assert run_python.name == "run_python" and run_python.inputs["code"]["type"] == "string"
    assert not run_python.kernel.started, "importing the module must not boot a sandbox"
    script = Script(
        "run_python",
        [
            call("run_python", code="total = 40 + 2"),
            call("run_python", code="import sys\nprint(total)\nprint('warned', file=sys.stderr)\ntotal * 2"),
            call("final_answer", answer="84"),
        ],
    )
    agent = ToolCallingAgent(tools=[run_python], model=ScriptedModel(script), max_steps=5, verbosity_level=0)
    try:
        assert agent.run("Compute.") == "84"
        script.assert_used_up()
        assert last_observation(script.inputs[1]) == "Observation:\n(no output)"
        assert last_observation(script.inputs[2]) == "Observation:\n42\n\n[stderr]\nwarned\n\n[result] 84"
        sb = run_python.sandbox
        assert sb.template == "code-interpreter"
        assert sb.metadata == integ.RUN_PYTHON_METADATA
        assert [s.id for s in Sandbox.list(metadata=integ.RUN_PYTHON_METADATA)] == [sb.id]
    finally:
        close()
    assert not sb.is_running()
    close()  # idempotent
    try:
        # A later call starts over in a new sandbox: the old state is gone.
        out = run_python(code="total")
        assert out.startswith("ERROR:") and "NameError" in out
        assert run_python.sandbox.id != sb.id
    finally:
        close()


def test_agent_carries_on_when_its_sandbox_stopped():
    """A sandbox the tool booted that stops under it (expired, or killed from
    elsewhere) is reported once in words the model can act on, and the next
    call runs in a new sandbox (every later call failed before)."""
    from pandastack.integrations.smolagents import PandaStackPythonTool

    tool = PandaStackPythonTool()
    script = Script(
        "run_python",
        [
            call("run_python", code="x = 41"),
            call("run_python", code="x + 1"),
            call("run_python", code="x = 1; x + 1"),
            call("final_answer", answer="2"),
        ],
    )
    first = None

    def kill_after_first(step, agent=None):
        nonlocal first
        if first is None and tool.kernel.started:
            first = tool.sandbox
            Sandbox.connect(first.id).kill()

    agent = ToolCallingAgent(
        tools=[tool], model=ScriptedModel(script), max_steps=6, verbosity_level=0, step_callbacks=[kill_after_first]
    )
    try:
        assert agent.run("Compute.") == "2"
        script.assert_used_up()
        lost = last_observation(script.inputs[2])
        assert f"the sandbox {first.id} that ran this agent's code has stopped" in lost
        assert "the next call runs in a new sandbox" in lost
        assert last_observation(script.inputs[3]) == "Observation:\n[result] 2"
        assert tool.sandbox.id != first.id and tool.sandbox.is_running()
    finally:
        tool.close()


def test_code_agent_with_executor_keeps_state_and_returns_final_answer():
    from pandastack.integrations.smolagents import PandaStackExecutor

    @tool
    def add(a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: the first one.
            b: the second one.
        """
        return a + b

    executor = PandaStackExecutor(metadata={"suite": "integrations-executor"}, chart_images=True)
    script = Script(
        "code-agent",
        [
            code("x = 7 * factor\nprint('x is', x)"),
            code("y = add(x, 21)\nprint('y is', y)\nraise KeyError('no such column')"),
            code("import matplotlib.pyplot as plt\nplt.plot([x, y])\nplt.show()"),
            code("final_answer({'x': x, 'y': y})"),
        ],
    )
    agent = CodeAgent(
        tools=[add],
        model=ScriptedModel(script),
        executor=executor,
        step_callbacks=[executor.add_chart_images],
        max_steps=6,
        verbosity_level=0,
    )
    with agent:
        result = agent.run("Compute x and y.", additional_args={"factor": 3})
        sb = executor.sandbox
        assert sb.is_running()
        script.assert_used_up()
        assert result == {"x": 21, "y": 42}
        # Step 1's print came back as the observation of step 1.
        assert "x is 21" in last_observation(script.inputs[1])
        # Step 2 ran the agent's tool inside the sandbox, then raised: the
        # model's next input has the kernel's traceback.
        nxt = "\n".join(text_of(m) for m in script.inputs[2])
        assert "y is 42" in nxt
        assert "KeyError" in nxt and "no such column" in nxt
        # Step 3's chart reached the model as an observation image.
        assert images_in(script.inputs[2]) == []
        imgs = images_in(script.inputs[3])
        assert len(imgs) == 1 and isinstance(imgs[0], PIL.Image.Image) and imgs[0].width > 100
    # Leaving the block ran cleanup(): the sandbox is gone.
    assert not sb.is_running()
    # The agent's code did not run here: the sandbox has its own process.
    assert "x" not in globals()


def test_executor_reports_packages_missing_from_the_sandbox():
    from pandastack.integrations.smolagents import PandaStackExecutor

    logged: List[str] = []

    class Logger:
        def log(self, *args, **kwargs):
            pass

        def log_error(self, msg):
            logged.append(msg)

    executor = PandaStackExecutor(["numpy", "pandas.io", "no_such_module_xyz"], logger=Logger())
    try:
        assert executor.installed_packages == ["numpy", "pandas.io", "no_such_module_xyz"]
        assert len(logged) == 1 and "no_such_module_xyz" in logged[0] and "numpy" not in logged[0]
        # Tools' requirements are pip names: pillow is there (as PIL).
        logged.clear()
        executor.install_packages(["pillow", "scikit-learn", "no-such-dist-xyz"])
        assert len(logged) == 1 and "no-such-dist-xyz" in logged[0], logged
        assert "pillow" not in logged[0] and "scikit-learn" not in logged[0], logged
    finally:
        executor.cleanup()


def test_parallel_agents_have_separate_sandboxes():
    from pandastack.integrations.smolagents import PandaStackPythonTool

    both_set = threading.Barrier(2, timeout=120)

    def after_barrier(answer):
        def turn(_messages):
            both_set.wait()
            return answer

        return turn

    def agent_for(me: str, other: str):
        tool = PandaStackPythonTool(metadata={"suite": "integrations-parallel", "agent": me})
        script = Script(
            f"agent-{me}",
            [
                call("run_python", code=f"secret_{me} = '{me}-value'"),
                # Both agents have set their variable before either reads.
                after_barrier(call("run_python", code=f"print(secret_{me})\nprint(secret_{other})")),
                call("final_answer", answer=f"{me} done"),
            ],
        )
        agent = ToolCallingAgent(tools=[tool], model=ScriptedModel(script), max_steps=5, verbosity_level=0)
        return tool, script, agent

    runs = [agent_for("a", "b"), agent_for("b", "a")]
    results: dict = {}
    errors: list = []

    def run(i):
        try:
            results[i] = runs[i][2].run("Go.")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            both_set.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert results == {0: "a done", 1: "b done"}
        for (tool, script, _), (me, other) in zip(runs, [("a", "b"), ("b", "a")]):
            script.assert_used_up()
            out = last_observation(script.inputs[2])
            assert f"{me}-value" in out  # its own variable is there
            assert "NameError" in out and f"secret_{other}" in out  # the other's is not
        assert runs[0][0].sandbox.id != runs[1][0].sandbox.id
    finally:
        for tool, _, _ in runs:
            tool.close()


def test_importing_pandastack_imports_no_framework():
    import subprocess

    code_ = (
        "import sys, pandastack, pandastack.integrations\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('smolagents', 'langchain_core', 'langgraph', 'crewai')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code_], check=True)
