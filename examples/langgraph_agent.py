"""A LangGraph ReAct agent whose Python runs in a PandaStack sandbox.

The tool answers the model with text (stdout, `[result]`, `ERROR:` and a
traceback, a `[chart]` line) and hands the charts to the application as its
artifact: this script saves them as PNG files.

    pip install './sdk/python[langchain]'   # from the repository's root langgraph langchain langchain-openai
    export PANDASTACK_API_KEY=...        # and PANDASTACK_API if not localhost:8080
    export OPENAI_API_KEY=...            # or another provider: LANGCHAIN_MODEL=anthropic:claude-sonnet-4-5 ...
    python examples/langgraph_agent.py ["your task"]
"""

from __future__ import annotations

import base64
import os
import sys

TASK = (
    "Make a pandas DataFrame of the monthly sales 120, 135, 150, 110, 160, 175 "
    "(January to June), report the best month and the total, and plot the sales "
    "as a line chart with matplotlib (plt.show())."
)
DEFAULT_MODEL = "openai:gpt-4o-mini"


def require_env() -> None:
    if not os.environ.get("PANDASTACK_API_KEY"):
        sys.exit("set PANDASTACK_API_KEY (and PANDASTACK_API if the server is not at http://localhost:8080)")
    if not os.environ.get("LANGCHAIN_MODEL") and not os.environ.get("OPENAI_API_KEY"):
        sys.exit(
            f"set OPENAI_API_KEY to use {DEFAULT_MODEL}, or LANGCHAIN_MODEL to another provider:model "
            "(with that provider's langchain package and key)"
        )


def build_model():
    from langchain.chat_models import init_chat_model

    return init_chat_model(os.environ.get("LANGCHAIN_MODEL") or DEFAULT_MODEL)


def main(model, task: str = TASK) -> str:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt import create_react_agent

    from pandastack.integrations.langchain import PandaStackPythonTool

    tool = PandaStackPythonTool(metadata={"example": "langgraph"})
    try:
        agent = create_react_agent(model, [tool])
        state = agent.invoke({"messages": [("user", task)]})
        n = 0
        for message in state["messages"]:
            if isinstance(message, ToolMessage):
                for block in message.artifact or []:
                    n += 1
                    with open(f"chart-{n}.png", "wb") as f:
                        f.write(base64.b64decode(block["base64"]))
                    print(f"chart written to chart-{n}.png")
        answer = state["messages"][-1].content
        print(answer)
        return str(answer)
    finally:
        tool.close()


if __name__ == "__main__":
    require_env()
    main(build_model(), " ".join(sys.argv[1:]) or TASK)
