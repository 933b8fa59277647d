"""An interactive shell in a sandbox, on a real terminal
(``GET /v1/sandboxes/{id}/pty``, a WebSocket)::

    with sandbox.terminal(cols=100, rows=30) as term:
        term.write("echo $((6*7))\\r")
        print(term.read_until("42"))

Needs the ``websockets`` package (the ``terminal`` extra).
"""

from __future__ import annotations

import builtins
import json
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Optional, Union
from urllib.parse import quote, urlencode

from .exceptions import APIConnectionError, PandaStackError, SandboxStoppedError, TimeoutError, error_from_response

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Terminal"]

SUBPROTOCOL = "pandastack.pty"

# The close code of a terminal whose sandbox stopped under it (4000 plus
# the HTTP status of sandbox_stopped); the reason says why.
CLOSE_SANDBOX_STOPPED = 4410
# WebSocket close codes the server ends a terminal with: the shell exited;
# the server shuts down; the caller's key was revoked (or a bad message).
CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY = 1000, 1001, 1008


class Terminal:
    """A login shell of the sandbox user on a pseudo-terminal. Keys go in with
    :meth:`write` (``"\\r"`` is Enter, ``"\\x03"`` is Ctrl-C); output comes out
    with :meth:`read`. Closing it (or leaving the ``with`` block) kills the
    shell and everything it started. While it is open the sandbox counts as
    busy: a snapshot, fork or pause answers ``ConflictError``."""

    def __init__(self, client: "Client", sandbox_id: str, cols: int = 80, rows: int = 24) -> None:
        try:
            from websockets.exceptions import InvalidHandshake, InvalidStatus
            from websockets.sync.client import connect
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(f"Sandbox.terminal needs websockets: pip install 'websockets>=13' ({e})") from e
        base = client.api_url.replace("http", "ws", 1)
        url = f"{base}/v1/sandboxes/{quote(sandbox_id)}/pty?{urlencode({'cols': cols, 'rows': rows})}"
        self._stack = ExitStack()
        try:
            self._ws = self._stack.enter_context(connect(
                url,
                additional_headers={"Authorization": f"Bearer {client.api_key}"},
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                open_timeout=60,
                max_size=1 << 20,
            ))
        except InvalidStatus as e:
            body = e.response.body or b""
            code, message = None, body.decode(errors="replace")
            try:
                err = json.loads(body)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise error_from_response(code, message, e.response.status_code) from None
        except builtins.TimeoutError as e:
            raise TimeoutError(f"the terminal of {sandbox_id} did not open within 60 s", code="client_timeout") from e
        except (OSError, InvalidHandshake) as e:
            raise APIConnectionError(
                f"cannot open the terminal of {sandbox_id} at {client.api_url}: {e}. Is `pandastack serve` running there?",
                code="connection_error",
            ) from e
        self.exit_code: Optional[int] = None
        self.closed = False
        #: Set when the sandbox stopped under the terminal (killed, its TTL,
        #: out of memory): what :meth:`read` and :meth:`write` raise then.
        self.stopped: Optional[SandboxStoppedError] = None
        #: Set when the terminal ended for another reason than its shell's
        #: exit (the sandbox stopped, the API key was revoked, the server
        #: shut down, the connection was lost): what :meth:`read` and
        #: :meth:`write` raise then.
        self.ended: Optional[PandaStackError] = None
        #: Everything the terminal has output so far, as :meth:`read` got it.
        self.output = ""

    def write(self, data: Union[str, bytes]) -> None:
        """Send keys to the shell. Raises :class:`SandboxStoppedError` when
        the sandbox has stopped, :class:`PandaStackError` once the terminal
        is closed otherwise."""
        self._send(data.encode() if isinstance(data, str) else bytes(data))

    def _send(self, message: Union[str, bytes]) -> None:
        """Send a message; once the terminal has closed, raise why."""
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(message)
        except ConnectionClosed as e:
            self._closed_by(e)
            if self.ended is not None:
                raise self.ended from None
            raise PandaStackError(f"the terminal is closed (the shell exited with status {self.exit_code})", code="terminal_closed") from None

    def _closed_by(self, e: Exception) -> None:
        """Record the close that e reports, and why, when not for the
        shell's exit or this side's close."""
        if self.closed or self.ended is not None:
            self.closed = True
            return
        self.closed = True
        rcvd = getattr(e, "rcvd", None)
        if rcvd is None:
            if self.exit_code is None:
                self.ended = APIConnectionError("the connection to the terminal was lost (no close from the server)", code="connection_error")
            return
        reason = rcvd.reason or ""
        if rcvd.code == CLOSE_SANDBOX_STOPPED:
            self.stopped = SandboxStoppedError(reason or "the sandbox has stopped", code="sandbox_stopped", status=410)
            self.ended = self.stopped
        elif rcvd.code == CLOSE_POLICY and "revoked" in reason:
            self.ended = error_from_response("unauthorized", reason, 401)
        elif rcvd.code == CLOSE_GOING_AWAY:
            self.ended = error_from_response("sandbox_unavailable", reason or "the server is shutting down", 503)
        elif rcvd.code != CLOSE_NORMAL:
            self.ended = PandaStackError(f"the terminal was closed ({rcvd.code}): {reason}", code="terminal_closed")

    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal's size (the shell gets SIGWINCH). Raises as
        :meth:`write` does once the terminal has closed."""
        self._send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def read(self, timeout: Optional[float] = None) -> str:
        """The next output of the terminal (decoded as UTF-8), or ``""`` once
        the shell has exited (then :attr:`exit_code` is set). Raises
        :class:`TimeoutError` when nothing comes within ``timeout`` seconds,
        :class:`SandboxStoppedError` when the sandbox stopped under the
        terminal (killed, its TTL, out of memory), :class:`AuthenticationError`
        when the API key was revoked, :class:`SandboxUnavailableError` when
        the server shut down, :class:`APIConnectionError` when the
        connection was lost."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                msg = self._ws.recv(timeout=timeout)
            except ConnectionClosed as e:
                self._closed_by(e)
                if self.ended is not None:
                    raise self.ended from None
                return ""
            except builtins.TimeoutError:
                raise TimeoutError(f"no terminal output within {timeout} s", code="timeout") from None
            if isinstance(msg, bytes):
                text = msg.decode(errors="replace")
                self.output += text
                return text
            ev = json.loads(msg)
            if ev.get("type") == "exit":
                self.exit_code = ev.get("exit_code")

    def read_until(self, text: str, timeout: float = 60, since: Optional[int] = None) -> str:
        """Read until the output contains ``text``, and return the output
        looked at. By default that is what this call reads. With ``since``, an
        offset into :attr:`output`, it is everything from there, including
        what earlier reads already got: use it to wait for text that may
        have come in the same read as an earlier match."""
        start = len(self.output) if since is None else since
        deadline = time.monotonic() + timeout
        while text not in self.output[start:]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{text!r} did not appear within {timeout} s; the terminal showed {self.output[start:][-500:]!r}", code="timeout")
            chunk = self.read(timeout=left)
            if chunk == "" and self.closed:
                raise PandaStackError(f"the shell exited (status {self.exit_code}) before {text!r} appeared: {self.output[start:][-500:]!r}")
        return self.output[start:]

    def close(self) -> None:
        """End the session: the shell and its children are killed."""
        self.closed = True
        self._stack.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
