"""Sandbox.terminal(): a real shell on a real terminal in a real sandbox."""

from __future__ import annotations

import pytest

import pandastack
from pandastack import Sandbox

pytest.importorskip("websockets")


def test_terminal_runs_a_shell_and_reports_its_exit(sandbox: Sandbox) -> None:
    with sandbox.terminal(cols=90, rows=20) as term:
        term.write("echo $((6*7)); stty size; whoami; echo E$((1+1))ND\r")
        out = term.read_until("E2ND").replace("\r", "")
        assert "42\n20 90\nuser\nE2ND" in out
        term.resize(120, 40)
        term.write("stty size\r")
        term.read_until("40 120")
        # While it is open the sandbox is busy: no snapshot.
        with pytest.raises(pandastack.ConflictError):
            sandbox.snapshot()
        term.write("exit 5\r")
        while term.read(timeout=30):
            pass
        assert term.exit_code == 5


def test_terminal_errors(sandbox: Sandbox) -> None:
    with pytest.raises(pandastack.InvalidRequestError):
        sandbox.terminal(cols=0)
    sandbox.kill()
    with pytest.raises(pandastack.NotFoundError):
        sandbox.terminal()
