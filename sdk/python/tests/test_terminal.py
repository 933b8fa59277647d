"""Sandbox.terminal(): a real shell on a real terminal in a real sandbox."""

from __future__ import annotations

import pytest

import pandastack
from pandastack import Sandbox

pytest.importorskip("websockets")


def test_terminal_runs_a_shell_and_reports_its_exit(sandbox: Sandbox) -> None:
    with sandbox.terminal(cols=90, rows=20) as term:
        term.write("PS1='py> '; echo $((6*7)); stty size; whoami; echo E$((1+1))ND\r")
        out = term.read_until("E2ND").replace("\r", "")
        assert "42\n20 90\nuser\nE2ND" in out
        # Resized at the next prompt (it may have come in the same read as
        # E2ND): readline reads the size and writes it back as it takes the
        # terminal for a new line, so a resize landing in between is undone.
        term.read_until("py> ", since=term.output.rindex("E2ND"))
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
        # A resize after the end fails as a write does, in the SDK's terms.
        with pytest.raises(pandastack.PandaStackError) as ei:
            term.resize(100, 30)
        assert ei.value.code == "terminal_closed", ei.value


def test_terminal_errors(sandbox: Sandbox) -> None:
    with pytest.raises(pandastack.InvalidRequestError):
        sandbox.terminal(cols=0)
    sandbox.kill()
    with pytest.raises(pandastack.NotFoundError):
        sandbox.terminal()


def test_terminal_of_a_sandbox_that_stops_under_it(server) -> None:
    sb = Sandbox.create(ttl_seconds=120)
    term = sb.terminal()
    try:
        term.write("echo up$((2+2))\r")
        term.read_until("up4")
        sb.kill()
        with pytest.raises(pandastack.SandboxStoppedError) as ei:
            term.read_until("never", timeout=30)
        assert ei.value.code == "sandbox_stopped" and "was killed" in ei.value.message
        with pytest.raises(pandastack.SandboxStoppedError):
            term.write("echo more\r")
    finally:
        term.close()


def test_terminal_whose_key_is_revoked_says_so(server) -> None:
    import httpx

    auth = {"Authorization": f"Bearer {server.api_key}"}
    made = httpx.post(f"{server.url}/v1/api-keys", json={"name": "py-terminal-revoke"}, headers=auth).json()
    sb = Sandbox.create(ttl_seconds=120)
    try:
        term = Sandbox.connect(sb.id, client=pandastack.Client(api_key=made["secret"], api_url=server.url)).terminal()
        term.write("echo up$((2+2))\r")
        term.read_until("up4")
        assert httpx.delete(f"{server.url}/v1/api-keys/{made['id']}", headers=auth).status_code == 204
        # Not "the shell exited (status None)": the revocation, as an
        # AuthenticationError, from the read and from a write after it.
        with pytest.raises(pandastack.AuthenticationError) as ei:
            term.read_until("never", timeout=30)
        assert "revoked" in ei.value.message and term.exit_code is None
        with pytest.raises(pandastack.AuthenticationError):
            term.write("echo more\r")
        term.close()
    finally:
        sb.kill()


class _Frames:
    """The terminal's WebSocket, as a list of output frames (a unit test of
    read_until's bookkeeping; the tests above drive a real shell)."""

    def __init__(self, *frames: bytes) -> None:
        self.frames = list(frames)

    def recv(self, timeout: float | None = None) -> bytes:
        if not self.frames:
            raise TimeoutError
        return self.frames.pop(0)


def test_read_until_since_sees_what_an_earlier_read_got() -> None:
    from pandastack.terminal import Terminal

    term = Terminal.__new__(Terminal)
    term._ws = _Frames(b"echo hi\r\nhi\r\nE2ND\r\n$ ", b"more")
    term.exit_code, term.closed, term.output = None, False, ""
    assert term.read_until("E2ND").endswith("$ ")
    # The prompt came in the same frame as E2ND: only since finds it.
    assert term.read_until("$ ", since=term.output.rindex("E2ND")) == "E2ND\r\n$ "
    assert term.read_until("more") == "more"
    assert term.output == "echo hi\r\nhi\r\nE2ND\r\n$ more"
    with pytest.raises(pandastack.TimeoutError):
        term.read_until("never", timeout=0.5)


def test_terminal_of_an_unreachable_server_says_so() -> None:
    """A server that cannot be reached is an APIConnectionError, as for any
    other call, not the transport's own exception."""
    import socket

    from pandastack.client import Client
    from pandastack.terminal import Terminal

    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % held.getsockname()[1]
        with pytest.raises(pandastack.APIConnectionError) as ei:
            Terminal(Client(api_key="pds_test", api_url=url), "sbx_none")
    assert ei.value.code == "connection_error" and url in ei.value.message
