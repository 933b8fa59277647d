"""The recipe "smolagents secure code execution with PandaStack", runnable.

A smolagents ToolCallingAgent whose `run_python` tool runs in a PandaStack
sandbox: one persistent kernel for the session, errors fed back as `ERROR:`
and a traceback, charts captured as PNGs.

    pip install './sdk/python[smolagents]'   # from the repository's root
    export PANDASTACK_API_KEY=...        # and PANDASTACK_API if not localhost:8080
    export HF_TOKEN=...                  # a Hugging Face token for Inference Providers
    python examples/smolagents_recipe.py ["your task"]

The charts the agent drew are written to chart-<n>.png in the current directory.
Without HF_TOKEN it says what to set and exits.
"""

from __future__ import annotations

import base64
import os
import sys

TASK = (
    "Generate 1,000 samples from a normal distribution (mean 50, std 8) with "
    "numpy. Report the sample mean and the 95th percentile, then plot a "
    "histogram of the samples with matplotlib (call plt.show())."
)


def require_env() -> None:
    missing = [v for v in ("PANDASTACK_API_KEY", "HF_TOKEN") if not os.environ.get(v)]
    if missing:
        sys.exit(
            f"set {' and '.join(missing)} to run this example: PANDASTACK_API_KEY is the key `pandastack serve` "
            "printed (PANDASTACK_API its URL, default http://localhost:8080); HF_TOKEN is a Hugging Face access "
            "token allowed to call Inference Providers (HF_MODEL_ID picks the model)."
        )


def build_model():
    from smolagents import InferenceClientModel

    model_id = os.environ.get("HF_MODEL_ID")
    return InferenceClientModel(model_id=model_id) if model_id else InferenceClientModel()


def main(model, task: str = TASK) -> str:
    from smolagents import ToolCallingAgent

    from pandastack.integrations.smolagents import close, run_python

    charts = []

    def save_chart(step, agent=None):
        # The recipe's "Surfacing the chart": the PNG is on the Execution.
        ex = run_python.last_execution
        if ex is not None and ex.png and all(ex is not seen for seen in charts):
            charts.append(ex)
            name = f"chart-{len(charts)}.png"
            with open(name, "wb") as f:
                f.write(base64.b64decode(ex.png))
            print(f"chart written to {name}")

    agent = ToolCallingAgent(tools=[run_python], model=model, step_callbacks=[save_chart])
    try:
        result = agent.run(task)
        print(result)
        return str(result)
    finally:
        close()  # kill the sandbox now rather than at its TTL


if __name__ == "__main__":
    require_env()
    main(build_model(), " ".join(sys.argv[1:]) or TASK)
