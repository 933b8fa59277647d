"""The examples/ scripts, run against the real server with the scripted
models of the framework tests in place of a real LLM (each example's main()
takes the model), and run bare to check they say what to set."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.code_interpreter

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
PNG = b"\x89PNG\r\n\x1a\n"

from scripted import Script  # noqa: E402


@pytest.fixture(autouse=True)
def _code_interpreter(server):
    from conftest import require_code_interpreter

    require_code_interpreter(server)


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_example(tmp_path, monkeypatch):
    pytest.importorskip("smolagents")
    from test_smolagents import ScriptedModel, call, last_observation

    from pandastack.integrations.smolagents import run_python

    monkeypatch.chdir(tmp_path)
    script = Script(
        "recipe-example",
        [
            call(
                "run_python",
                code=(
                    "import numpy as np\nsamples = np.random.default_rng(0).normal(50, 8, 1000)\n"
                    "print(round(float(samples.mean()), 1), round(float(np.percentile(samples, 95)), 1))"
                ),
            ),
            call("run_python", code="import matplotlib.pyplot as plt\nplt.hist(samples, bins=30)\nplt.show()"),
            call("final_answer", answer="mean about 50, p95 about 63"),
        ],
    )
    assert load("smolagents_recipe").main(ScriptedModel(script)) == "mean about 50, p95 about 63"
    script.assert_used_up()
    mean, p95 = map(float, last_observation(script.inputs[1]).split("\n")[1].split())
    assert 49 < mean < 51 and 60 < p95 < 66
    assert (tmp_path / "chart-1.png").read_bytes()[:8] == PNG
    assert not run_python.kernel.started  # the example closed it


def test_parallel_agents_example():
    pytest.importorskip("smolagents")
    from test_smolagents import ScriptedModel, call, last_observation

    tasks = {"alpha": "a", "beta": "b", "gamma": "c"}
    scripts = {
        name: Script(
            f"parallel-{name}",
            [
                call("run_python", code=f"data = {name!r} * 3"),
                call("run_python", code="print(data)"),
                call("final_answer", answer=f"{name} finished"),
            ],
        )
        for name in tasks
    }
    answers = load("parallel_agents").main(lambda name: ScriptedModel(scripts[name]), tasks)
    assert answers == {name: f"{name} finished" for name in tasks}
    for name, script in scripts.items():
        script.assert_used_up()
        # Same variable name in every agent, each sees only its own value.
        assert last_observation(script.inputs[2]) == f"Observation:\n{name * 3}"


@pytest.mark.snapshots
def test_resume_example_restores_the_kernel_across_runs(tmp_path, monkeypatch):
    pytest.importorskip("smolagents")
    from test_smolagents import ScriptedModel, call, last_observation

    from pandastack import NotFoundError, Sandbox

    state = tmp_path / "session.json"
    monkeypatch.setenv("PANDASTACK_SESSION_FILE", str(state))
    example = load("resume_agent")

    first = Script(
        "resume-1",
        [call("run_python", code="nums = list(range(1, 51))\nsum(nums)"), call("final_answer", answer="1275")],
    )
    assert example.main(ScriptedModel(first), "load nums") == "1275"
    first.assert_used_up()
    assert last_observation(first.inputs[1]) == "Observation:\n[result] 1275"
    snap1 = json.loads(state.read_text())["snapshot_id"]

    # A "restart": a fresh module, the same session file.
    example = load("resume_agent")
    second = Script(
        "resume-2",
        [call("run_python", code="sum(n * n for n in nums)"), call("final_answer", answer="42925")],
    )
    assert example.main(ScriptedModel(second), "square them") == "42925"
    second.assert_used_up()
    assert last_observation(second.inputs[1]) == "Observation:\n[result] 42925"  # nums came back
    snap2 = json.loads(state.read_text())["snapshot_id"]
    assert snap2 != snap1
    with pytest.raises(NotFoundError):
        Sandbox.get_snapshot(snap1)  # only the latest state is kept

    example.forget()
    assert not state.exists()
    with pytest.raises(NotFoundError):
        Sandbox.get_snapshot(snap2)


def test_langgraph_example(tmp_path, monkeypatch):
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from test_langchain import ScriptedChatModel, call

    monkeypatch.chdir(tmp_path)
    script = Script(
        "langgraph-example",
        [
            call("import pandas as pd\nsales = pd.Series([120, 135, 150, 110, 160, 175])\nint(sales.sum())"),
            call("import matplotlib.pyplot as plt\nsales.plot()\nplt.show()"),
            AIMessage(content="June is the best month; the total is 850."),
        ],
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answer = load("langgraph_agent").main(ScriptedChatModel(script=script))
    assert answer == "June is the best month; the total is 850."
    script.assert_used_up()
    assert (tmp_path / "chart-1.png").read_bytes()[:8] == PNG


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_crewai_example(code_sandbox):
    pytest.importorskip("crewai")
    from test_crewai import ScriptedLLM, call, last_tool_result

    code_sandbox.run_code("fib = [0, 1]")
    script = Script(
        "crewai-example",
        [
            call("while len(fib) < 20:\n    fib.append(fib[-1] + fib[-2])\nsum(1 for f in fib if f % 2 == 0)"),
            "7 of the first 20 Fibonacci numbers are even.",
        ],
    )
    out = load("crewai_crew").main(ScriptedLLM(model="scripted", script=script), sandbox_id=code_sandbox.id)
    assert out == "7 of the first 20 Fibonacci numbers are even."
    script.assert_used_up()
    assert last_tool_result(script.inputs[1]) == "[result] 7"
    assert code_sandbox.is_running()  # given by id: not the example's to kill
    assert code_sandbox.run_code("len(fib)").text == "20"


@pytest.mark.parametrize(
    "name, needs",
    [
        ("smolagents_recipe", "HF_TOKEN"),
        ("parallel_agents", "HF_TOKEN"),
        ("resume_agent", "HF_TOKEN"),
        ("langgraph_agent", "OPENAI_API_KEY"),
        ("crewai_crew", "OPENAI_API_KEY"),
    ],
)
def test_examples_say_what_to_set(name, needs):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "OPENAI_API_KEY", "LANGCHAIN_MODEL", "CREWAI_MODEL")}
    env["PANDASTACK_API_KEY"] = env.get("PANDASTACK_API_KEY") or "pds_unused"
    args = [sys.executable, str(EXAMPLES / f"{name}.py")] + (["a task"] if name == "resume_agent" else [])
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert needs in r.stderr and "set" in r.stderr
    assert "Traceback" not in r.stderr

