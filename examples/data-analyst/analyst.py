"""The data analyst: a smolagents ToolCallingAgent with the recipe's
``run_python`` tool, exploring one uploaded CSV in one PandaStack sandbox.
Every tool call is reported as it finishes (its code, output, charts and
tables) through a callback, which app.py turns into server-sent events.

The model is any OpenAI-compatible endpoint from the environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``DATA_ANALYST_MODEL``); with none
configured, :class:`DemoModel` plays a fixed analysis so the app works
offline end to end.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from smolagents import ToolCallingAgent
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

from pandastack import Client, Sandbox
from pandastack.integrations.smolagents import PandaStackPythonTool

DATA_PATH = "/home/user/data.csv"

Emit = Callable[[Dict[str, Any]], None]


class StreamingTool(PandaStackPythonTool):
    """run_python that reports each call, as it starts and as it ends."""

    def __init__(self, emit: Emit, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.emit = emit
        self.calls = 0

    def forward(self, code: str) -> str:
        self.calls += 1
        n = self.calls
        self.emit({"type": "step", "step": n, "code": code, "status": "running"})
        try:
            answer = super().forward(code)
        except Exception as e:  # the tool's failure is the agent's to read
            self.emit({"type": "step", "step": n, "code": code, "status": "failed", "error": str(e)})
            raise
        ex = self.last_execution
        charts = [r.png for r in ex.results if r.png] or ([ex.png] if ex.png else [])
        tables = [r.html for r in ex.results if r.html and "<table" in r.html]
        self.emit({
            "type": "step", "step": n, "code": code, "status": "error" if ex.error else "done",
            "stdout": ex.stdout, "stderr": ex.stderr, "text": ex.text if not tables else None,
            "error": str(ex.error) if ex.error else None, "charts": charts, "tables": tables,
        })
        return answer


def _call(n: int, name: str, **arguments: Any) -> ChatMessage:
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content="",
        tool_calls=[ChatMessageToolCall(id=f"call_{n}", type="function",
                                        function=ChatMessageToolCallFunction(name=name, arguments=arguments))],
    )


def _last_observation(messages: List[Any]) -> str:
    for m in reversed(messages):
        role = m.role if hasattr(m, "role") else m.get("role")
        if role == MessageRole.TOOL_RESPONSE:
            content = m.content if hasattr(m, "content") else m.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(item.get("text", "") for item in content or [] if item.get("type") == "text")
    return ""


class DemoModel(Model):
    """A scripted model: a fixed exploration of whatever CSV was uploaded
    (shape and head, summary, a histogram per numeric column, correlations),
    then an answer built from what the sandbox printed. It pauses ``pace``
    seconds before each turn, as a real model would think, so the page shows
    the run unfold."""

    TURNS = [
        # Excel and older tools write Latin-1 (cp1252) as often as UTF-8.
        "import pandas as pd\n"
        "try:\n"
        f"    df = pd.read_csv({DATA_PATH!r})\n"
        "except UnicodeDecodeError:\n"
        f"    df = pd.read_csv({DATA_PATH!r}, encoding='cp1252')\n"
        "    print('(not UTF-8: read as Windows-1252)')\n"
        "print(f'{len(df)} rows, {len(df.columns)} columns: {\", \".join(map(str, df.columns))}')\n"
        "df.head(10)",
        "numeric = df.select_dtypes('number')\n"
        "print(f'{len(numeric.columns)} numeric columns')\n"
        "(numeric if len(numeric.columns) else df.astype(str)).describe().round(2) if len(df) else df",
        "import matplotlib.pyplot as plt\n"
        "cols = list(numeric.columns)[:4]\n"
        "if cols and len(df):\n"
        "    fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 3), squeeze=False)\n"
        "    for ax, c in zip(axes[0], cols):\n"
        "        ax.hist(numeric[c].dropna(), bins=20, color='#1f6feb')\n"
        "        ax.set_title(c)\n"
        "    plt.tight_layout()\n"
        "    plt.show()\n"
        "elif len(df.columns) and len(df):\n"
        "    top = df[df.columns[0]].astype(str).value_counts().head(10)\n"
        "    top.plot.barh(title=f'most frequent values of {df.columns[0]}'); plt.tight_layout(); plt.show()\n"
        "else:\n"
        "    print('no rows to chart')",
        "corr = numeric.corr().round(2)\n"
        "pairs = corr.where(~corr.isna()).stack()\n"
        "pairs = pairs[pairs.index.get_level_values(0) < pairs.index.get_level_values(1)]\n"
        "best = pairs.abs().sort_values(ascending=False).head(1)\n"
        "if len(best):\n"
        "    a, b = best.index[0]\n"
        "    print(f'strongest correlation: {a} ~ {b} ({corr.loc[a, b]})')\n"
        "    plt.figure(figsize=(5, 4)); plt.scatter(df[a], df[b], s=12); plt.xlabel(a); plt.ylabel(b); plt.title(f'{a} vs {b}'); plt.show()\n"
        "else:\n"
        "    print('fewer than two numeric columns: no correlation to show')",
    ]

    def __init__(self, pace: float = 1.0) -> None:
        super().__init__(model_id="pandastack-demo")
        self.pace = pace
        self.turn = 0

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        time.sleep(self.pace)
        self.turn += 1
        first = _last_observation(messages).replace("Observation:", "").strip()
        if self.turn == 2 and first.startswith("ERROR:"):
            # The rest needs the table the first step could not read.
            return _call(self.turn, "final_answer", answer="Demo analysis stopped (scripted model, no LLM): "
                         "the upload could not be read as a CSV table.\n" + first)
        if self.turn <= len(self.TURNS):
            return _call(self.turn, "run_python", code=self.TURNS[self.turn - 1])
        summary = _last_observation(messages).replace("Observation:", "").split("[chart]")[0].strip() or "the analysis ran"
        return _call(self.turn, "final_answer", answer=f"Demo analysis done (scripted model, no LLM). Last finding: {summary}")


def make_model() -> Model:
    """The OpenAI-compatible model of the environment, else the demo model."""
    base, key = os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")
    if base or key:
        from smolagents import OpenAIServerModel  # needs the openai package

        return OpenAIServerModel(
            model_id=os.environ.get("DATA_ANALYST_MODEL", "gpt-4o-mini"),
            api_base=base,
            api_key=key,
        )
    return DemoModel(pace=float(os.environ.get("DATA_ANALYST_DEMO_PACE", "1.0")))


INSTRUCTIONS = (
    "You are a data analyst. The user's CSV file is at {path} in a persistent Python sandbox "
    "(pandas, numpy and matplotlib are installed; there is no network). Explore it step by step with "
    "run_python: load it, look at its columns, compute what the question needs, and draw charts with "
    "matplotlib (plt.show() sends them to the user). Then answer the question in a few sentences with "
    "the figures you found.\n\nQuestion: {question}"
)


# The sandboxes of the analyses under way, so that a server stopping in the
# middle of one kills them (its run's thread dies with the process, before
# its own kill): kill_live_sandboxes.
_live: Dict[str, Sandbox] = {}
_live_lock = threading.Lock()
_closing = False  # set by kill_live_sandboxes: a sandbox made after it is killed at once


def kill_live_sandboxes() -> int:
    """Kill the sandboxes of the analyses still running, and of those that
    start from now on (the app is stopping); how many."""
    global _closing
    with _live_lock:
        _closing = True
        boxes = list(_live.values())
        _live.clear()
    for sb in boxes:
        try:
            sb.kill()
        except Exception:  # the server may be gone too; its TTL ends them then
            pass
    return len(boxes)


def analyse(csv: bytes, question: str, emit: Emit, client: Optional[Client] = None,
            model: Optional[Model] = None, max_steps: int = 10) -> str:
    """Run the agent on the CSV; emit every step; return its answer. The
    sandbox is killed at the end, whatever happens."""
    # No network: the prompt says so, and the user's data stays in the sandbox.
    sandbox = Sandbox.create(template="code-interpreter", ttl_seconds=1800,
                             metadata={"app": "data-analyst"}, network={"allow_internet_access": False},
                             client=client)
    with _live_lock:
        closing = _closing
        if not closing:
            _live[sandbox.id] = sandbox
    if closing:  # made while the app stopped: nothing will run in it
        sandbox.kill()
        raise RuntimeError("the app is stopping")
    emit({"type": "sandbox", "sandbox_id": sandbox.id})
    try:
        sandbox.files.write(DATA_PATH, csv)
        tool = StreamingTool(emit, sandbox=sandbox)
        agent = ToolCallingAgent(tools=[tool], model=model or make_model(), max_steps=max_steps, verbosity_level=0)
        answer = agent.run(INSTRUCTIONS.format(path=DATA_PATH, question=question or "What is in this data?"))
        return str(answer)
    finally:
        with _live_lock:
            _live.pop(sandbox.id, None)
        sandbox.kill()
