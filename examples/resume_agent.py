"""An agent session that survives restarts of this script: at the end of a
run the sandbox is snapshotted (memory, kernel variables, files) and the
snapshot id stored in a file; the next run restores it, so the agent finds
the variables of the previous run.

    pip install './sdk/python[smolagents]'   # from the repository's root
    export PANDASTACK_API_KEY=...        # and PANDASTACK_API if not localhost:8080
    export HF_TOKEN=...                  # a Hugging Face token for Inference Providers
    python examples/resume_agent.py "Load the numbers 1..50 into a variable nums and report their sum"
    python examples/resume_agent.py "Plot nums squared"          # nums is still there
    python examples/resume_agent.py --forget                      # delete the snapshot and the file

The snapshot id is kept in .pandastack-session.json (PANDASTACK_SESSION_FILE
to change it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Tuple


def session_file() -> Path:
    return Path(os.environ.get("PANDASTACK_SESSION_FILE", ".pandastack-session.json"))


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


def stored_snapshot() -> Optional[str]:
    try:
        return json.loads(session_file().read_text())["snapshot_id"]
    except FileNotFoundError:
        return None


def open_sandbox() -> Tuple[object, Optional[str]]:
    """The sandbox of the session: restored from the stored snapshot, else new."""
    from pandastack import NotFoundError, Sandbox

    snap = stored_snapshot()
    if snap:
        try:
            sandbox = Sandbox.create(snapshot_id=snap, ttl_seconds=3600)
            print(f"resumed the session from snapshot {snap}")
            return sandbox, snap
        except NotFoundError:
            print(f"snapshot {snap} is gone: starting a new session")
    return Sandbox.create(template="code-interpreter", ttl_seconds=3600, metadata={"example": "resume"}), None


def main(model, task: str) -> str:
    from smolagents import ToolCallingAgent

    from pandastack import Sandbox
    from pandastack.integrations.smolagents import PandaStackPythonTool

    sandbox, previous = open_sandbox()
    try:
        # Attached to the sandbox, the tool runs in its default Python
        # context, whose variables a restore brings back.
        tool = PandaStackPythonTool(sandbox=sandbox)
        agent = ToolCallingAgent(tools=[tool], model=model)
        answer = str(agent.run(task))
        print(answer)
        snap = sandbox.snapshot(metadata={"example": "resume"})
        session_file().write_text(json.dumps({"snapshot_id": snap}) + "\n")
        print(f"session saved as snapshot {snap} (in {session_file()})")
        if previous:
            Sandbox.delete_snapshot(previous)  # only the latest state is kept
        return answer
    finally:
        sandbox.kill()  # the snapshot holds the state; no VM idles until the next run


def forget() -> None:
    from pandastack import NotFoundError, Sandbox

    snap = stored_snapshot()
    if snap:
        try:
            Sandbox.delete_snapshot(snap)
        except NotFoundError:
            pass
        session_file().unlink()
        print(f"deleted snapshot {snap} and {session_file()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--forget"]:
        if not os.environ.get("PANDASTACK_API_KEY"):
            sys.exit("set PANDASTACK_API_KEY")
        forget()
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    require_env()
    main(build_model(), " ".join(sys.argv[1:]))
