"""CrewAI integration: a real Crew kickoff, driven by a scripted LLM (a CrewAI
BaseLLM with native function calling), against the real server."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
import threading
from typing import Any, Dict, Iterator, List

import pytest

pytestmark = [
    pytest.mark.code_interpreter,
    # CrewAI 1.15 warns about its own deprecated fields on every kickoff.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

# CrewAI reports telemetry and may offer execution traces: neither here (no
# network, and no questions on stdin). Its storage goes to a scratch dir,
# removed when the run ends.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("CREWAI_DISABLE_VERSION_CHECK", "true")
if "CREWAI_STORAGE_DIR" not in os.environ:
    _storage = tempfile.mkdtemp(prefix="crewai-test-")
    atexit.register(shutil.rmtree, _storage, ignore_errors=True)
    os.environ["CREWAI_STORAGE_DIR"] = _storage

pytest.importorskip("crewai")


# Its locks too: by default each is a file in the system's temp dir that
# CrewAI never removes (one was left by every run); the tests are one
# process, which an in-process lock serves (CrewAI's set_lock_backend, meant
# for this).
_locks: Dict[str, threading.RLock] = {}


@contextlib.contextmanager
def _in_process_lock(name: str, timeout: float = 120) -> Iterator[None]:
    lock = _locks.setdefault(name, threading.RLock())  # atomic under the GIL
    if not lock.acquire(timeout=timeout):
        raise TimeoutError(f"CrewAI lock {name!r} not acquired within {timeout} s")
    try:
        yield
    finally:
        lock.release()


try:
    from crewai_core import lock_store as _lock_store
except ImportError:  # a CrewAI without the central lock store
    _lock_store = None
if _lock_store is not None and hasattr(_lock_store, "set_lock_backend"):
    _lock_store.set_lock_backend(_in_process_lock)

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402

from scripted import Script  # noqa: E402


@pytest.fixture(autouse=True)
def _code_interpreter(server):
    from conftest import require_code_interpreter

    require_code_interpreter(server)


class ScriptedLLM(BaseLLM):
    """A CrewAI LLM that answers from a Script: a list of tool calls, or the
    final answer as text. It records the tool schemas it was offered."""

    script: Any = None
    offered: List[List[str]] = []

    def call(
        self,
        messages,
        tools=None,
        callbacks=None,
        available_functions=None,
        from_task=None,
        from_agent=None,
        response_model=None,
    ):
        self.offered.append([t["function"]["name"] for t in tools or []])
        return self.script.next(messages)

    def supports_function_calling(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return 32_000


_ids = iter(range(1, 10_000))


def call(code: str) -> List[Dict[str, Any]]:
    return [
        {
            "id": f"call_{next(_ids)}",
            "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": code})},
        }
    ]


def last_tool_result(messages: List[Dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "tool":
            return str(m.get("content"))
    raise AssertionError(f"no tool message in the model input: {messages!r}")


def crew_for(tool, llm) -> Crew:
    analyst = Agent(
        role="Data analyst",
        goal="Answer questions by running Python",
        backstory="You run every computation in a sandbox.",
        tools=[tool],
        llm=llm,
        allow_delegation=False,
        max_iter=10,
        verbose=False,
    )
    task = Task(description="Compute the total and plot it.", expected_output="The total.", agent=analyst)
    return Crew(agents=[analyst], tasks=[task], verbose=False)


def test_crew_keeps_state_reads_errors_and_reports_charts():
    from pandastack.integrations.crewai import PandaStackPythonTool

    tool = PandaStackPythonTool(metadata={"suite": "integrations-crewai"})
    assert tool.persistent and not tool.kernel.started
    script = Script(
        "crewai",
        [
            call("values = [5, 10, 15]\nn = 0\nprint('stored', len(values))"),
            call("n += 1\nprint(sum(values) * n)"),
            call("n += 1\nprint(sum(values) * n)"),  # the same call again: run, not served from a cache
            call("import json\njson.loads('{not json')"),
            call("import matplotlib.pyplot as plt\nplt.bar(range(3), values)\nplt.show()"),
            "The total is 30.",
        ],
    )
    llm = ScriptedLLM(model="scripted", script=script)
    try:
        out = crew_for(tool, llm).kickoff()
        script.assert_used_up()
        assert out.raw == "The total is 30."
        assert all(names == ["run_python"] for names in llm.offered), llm.offered

        inputs = script.inputs
        assert last_tool_result(inputs[1]) == "stored 3"
        assert last_tool_result(inputs[2]) == "30"  # `values` survived between calls
        assert last_tool_result(inputs[3]) == "60"
        err = last_tool_result(inputs[4])
        assert err.startswith("ERROR:\n"), err
        assert "JSONDecodeError" in err
        assert last_tool_result(inputs[5]) == "[chart] PNG produced (available as ex.png on the Execution)"
        charts = tool.last_charts
        assert len(charts) == 1
        import base64

        assert base64.b64decode(charts[0])[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        sb = tool.sandbox if tool.kernel.started else None
        tool.close()
    assert sb is not None and not sb.is_running()


def test_tool_attached_to_sandbox_id_and_non_persistent_mode(code_sandbox):
    from pandastack.integrations.crewai import PandaStackPythonTool

    code_sandbox.run_code("answer = 42")  # the sandbox's default Python context
    attached = PandaStackPythonTool(sandbox_id=code_sandbox.id)
    assert attached.run(code="answer") == "[result] 42"
    attached.run(code="answer += 1")
    attached.close()
    assert code_sandbox.is_running()  # not the tool's to kill
    assert code_sandbox.run_code("answer").text == "43"

    fresh = PandaStackPythonTool(sandbox_id=code_sandbox.id, persistent=False)
    try:
        assert fresh.run(code="scratch = 1\nscratch") == "[result] 1"
        out = fresh.run(code="scratch")
        assert out.startswith("ERROR:") and "NameError" in out
    finally:
        fresh.close()
    assert code_sandbox.is_running()
    # non-persistent runs leave no contexts behind
    ids_before = {c.id for c in code_sandbox.list_code_contexts()}
    fresh.run(code="1")
    assert {c.id for c in code_sandbox.list_code_contexts()} == ids_before



def test_non_persistent_tool_carries_on_when_its_sandbox_stopped():
    """A non-persistent tool (a fresh context per call) whose own sandbox was
    killed from elsewhere says so once, then runs in a new sandbox (every
    later call failed with NotFoundError)."""
    from pandastack import Sandbox
    from pandastack.integrations import SandboxLostError
    from pandastack.integrations.crewai import PandaStackPythonTool

    tool = PandaStackPythonTool(persistent=False)
    try:
        assert tool.run(code="6 * 7") == "[result] 42"
        first = tool.sandbox.id
        Sandbox.connect(first).kill()
        with pytest.raises(SandboxLostError, match=f"the sandbox {first} that ran this agent's code has stopped"):
            tool.run(code="1")
        assert tool.run(code="2 + 2") == "[result] 4"
        assert tool.sandbox.id != first
    finally:
        tool.close()
