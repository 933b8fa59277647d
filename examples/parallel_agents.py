"""Several smolagents agents at once, each with its own PandaStack sandbox
(one kernel per agent), so their variables never mix.

    pip install './sdk/python[smolagents]'   # from the repository's root
    export PANDASTACK_API_KEY=...        # and PANDASTACK_API if not localhost:8080
    export HF_TOKEN=...                  # a Hugging Face token for Inference Providers
    python examples/parallel_agents.py
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict

TASKS: Dict[str, str] = {
    "primes": "Store the primes below 1000 in a variable `data` and report how many there are and their sum.",
    "squares": "Store the squares of 1 to 100 in a variable `data` and report their mean and median.",
    "words": "Store the words of 'the quick brown fox jumps over the lazy dog' in `data` and report the longest.",
}


def require_env() -> None:
    missing = [v for v in ("PANDASTACK_API_KEY", "HF_TOKEN") if not os.environ.get(v)]
    if missing:
        sys.exit(
            f"set {' and '.join(missing)} to run this example: PANDASTACK_API_KEY is the key `pandastack serve` "
            "printed (PANDASTACK_API its URL); HF_TOKEN is a Hugging Face access token allowed to call "
            "Inference Providers (HF_MODEL_ID picks the model)."
        )


def build_model():
    from smolagents import InferenceClientModel

    model_id = os.environ.get("HF_MODEL_ID")
    return InferenceClientModel(model_id=model_id) if model_id else InferenceClientModel()


def main(make_model: Callable[[str], object], tasks: Dict[str, str] = TASKS) -> Dict[str, str]:
    """Run one agent per task in parallel; make_model(name) gives each its model."""
    from smolagents import ToolCallingAgent

    from pandastack.integrations.smolagents import PandaStackPythonTool

    # One tool, so one sandbox and one kernel, per agent: all three can keep a
    # variable called `data` without seeing each other's.
    tools = {name: PandaStackPythonTool(metadata={"example": "parallel", "agent": name}) for name in tasks}

    def run(name: str) -> str:
        agent = ToolCallingAgent(tools=[tools[name]], model=make_model(name), name=name)
        return str(agent.run(tasks[name]))

    try:
        with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
            answers = dict(zip(tasks, pool.map(run, tasks)))
        for name, answer in answers.items():
            print(f"{name}: {answer}  (sandbox {tools[name].sandbox.id})")
        return answers
    finally:
        for tool in tools.values():
            tool.close()


if __name__ == "__main__":
    require_env()
    model = build_model()
    main(lambda name: model)
