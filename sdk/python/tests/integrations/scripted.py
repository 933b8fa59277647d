"""A scripted model's turns, shared by the framework tests: no LLM, no
network. Each framework's model wraps a Script in its own public model
interface; the agent loop under test is the framework's real one."""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, List, Sequence, Union

import pytest

# A turn is the model's answer, or a function of the model's input that
# returns it (to wait on a barrier, say).
Turn = Union[Any, Callable[[Any], Any]]


class Script:
    """A fixed sequence of model answers.

    ``next(model_input)`` records the input and returns the next answer. A
    call past the end fails the test (pytest.fail raises a BaseException,
    which agent loops do not swallow as a model error); :meth:`assert_used_up`
    fails it when turns are left.
    """

    def __init__(self, name: str, turns: Sequence[Turn]) -> None:
        self.name = name
        self.turns = list(turns)
        self.inputs: List[Any] = []
        self.extra_calls = 0
        self._lock = threading.Lock()

    def next(self, model_input: Any) -> Any:
        with self._lock:
            i = len(self.inputs)
            try:  # inputs may be mutated by the loop later: keep them as they were
                self.inputs.append(copy.deepcopy(model_input))
            except Exception:
                self.inputs.append(model_input)
            if i >= len(self.turns):
                self.extra_calls += 1
                pytest.fail(
                    f"{self.name}: unexpected model call #{i + 1} (the script has {len(self.turns)} turns); "
                    f"its input ended with: {str(model_input)[-800:]}",
                    pytrace=False,
                )
            turn = self.turns[i]
        return turn(model_input) if callable(turn) else turn

    def assert_used_up(self) -> None:
        assert self.extra_calls == 0, f"{self.name}: {self.extra_calls} unexpected model call(s)"
        assert len(self.inputs) == len(self.turns), (
            f"{self.name}: the agent stopped after {len(self.inputs)} of {len(self.turns)} model turns"
        )
