"""A CrewAI crew whose analyst runs Python in a PandaStack sandbox.

    pip install './sdk/python[crewai]'   # from the repository's root
    export PANDASTACK_API_KEY=...        # and PANDASTACK_API if not localhost:8080
    export OPENAI_API_KEY=...            # CREWAI_MODEL picks another model, e.g. anthropic/claude-sonnet-4-5
    python examples/crewai_crew.py ["your task"]

    # or work in a sandbox you already have (its default Python context):
    PANDASTACK_SANDBOX_ID=sbx_... python examples/crewai_crew.py
"""

from __future__ import annotations

import os
import sys

TASK = (
    "Compute the first 20 Fibonacci numbers, report how many of them are even, "
    "and plot them on a log scale with matplotlib (plt.show())."
)
DEFAULT_MODEL = "gpt-4o-mini"


def require_env() -> None:
    if not os.environ.get("PANDASTACK_API_KEY"):
        sys.exit("set PANDASTACK_API_KEY (and PANDASTACK_API if the server is not at http://localhost:8080)")
    if not os.environ.get("CREWAI_MODEL") and not os.environ.get("OPENAI_API_KEY"):
        sys.exit(f"set OPENAI_API_KEY to use {DEFAULT_MODEL}, or CREWAI_MODEL (and that provider's key)")


def build_llm():
    from crewai import LLM

    return LLM(model=os.environ.get("CREWAI_MODEL") or DEFAULT_MODEL)


def main(llm, task: str = TASK, sandbox_id: str | None = None) -> str:
    from crewai import Agent, Crew, Task

    from pandastack.integrations.crewai import PandaStackPythonTool

    # Persistent by default: one kernel for the whole crew run.
    tool = PandaStackPythonTool(sandbox_id=sandbox_id) if sandbox_id else PandaStackPythonTool()
    try:
        analyst = Agent(
            role="Data analyst",
            goal="Answer with numbers computed in Python, never guessed",
            backstory="You run every computation in a secure sandbox and fix your code when it fails.",
            tools=[tool],
            llm=llm,
            allow_delegation=False,
        )
        work = Task(description=task, expected_output="The numbers asked for, in one short paragraph.", agent=analyst)
        result = Crew(agents=[analyst], tasks=[work]).kickoff()
        print(result.raw)
        if tool.last_charts:
            print(f"the last call drew {len(tool.last_charts)} chart(s) (tool.last_charts holds the PNGs)")
        return result.raw
    finally:
        tool.close()  # kills the sandbox it booted; a sandbox given by id keeps running


if __name__ == "__main__":
    require_env()
    main(build_llm(), " ".join(sys.argv[1:]) or TASK, os.environ.get("PANDASTACK_SANDBOX_ID"))
