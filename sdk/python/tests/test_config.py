"""Configuration from the environment, and the package's public surface."""

from __future__ import annotations

import socket

import pytest

import pandastack
from pandastack import (
    APIConnectionError,
    AsyncSandbox,
    Client,
    ConfigurationError,
    PandaStackError,
    Sandbox,
)


def test_public_surface():
    from pandastack import (  # noqa: F401  the names the issue promises
        AsyncSandbox,
        AuthenticationError,
        Client,
        CodeContext,
        ConflictError,
        ExecResult,
        Execution,
        ExecutionError,
        InvalidRequestError,
        NotFoundError,
        PandaStackError,
        Result,
        Sandbox,
        SandboxError,
        SandboxUnavailableError,
        TimeoutError,
    )

    for name in pandastack.__all__:
        assert hasattr(pandastack, name), name
    assert issubclass(pandastack.SandboxUnavailableError, pandastack.SandboxError)
    assert issubclass(pandastack.SandboxStoppedError, pandastack.SandboxError)
    assert not issubclass(pandastack.SandboxStoppedError, pandastack.SandboxUnavailableError)  # no retry helps
    assert issubclass(pandastack.TimeoutError, builtins_timeout())
    e = pandastack.NotFoundError("gone", code="not_found", status=404)
    assert (e.code, e.status, e.message) == ("not_found", 404, "gone")
    assert isinstance(e, PandaStackError)


def builtins_timeout():
    import builtins

    return builtins.TimeoutError


def test_missing_api_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("PANDASTACK_API_KEY", raising=False)
    with pytest.raises(ConfigurationError) as ei:
        Sandbox.create()
    assert "PANDASTACK_API_KEY" in str(ei.value)
    assert ei.value.code == "missing_api_key"
    with pytest.raises(ConfigurationError, match="PANDASTACK_API_KEY"):
        Client()
    with pytest.raises(ConfigurationError, match="PANDASTACK_API_KEY"):
        Sandbox.list()
    with pytest.raises(ConfigurationError, match="PANDASTACK_API_KEY"):
        Sandbox.connect("sbx_aaaaaaaaaaaaaaaa")
    monkeypatch.setenv("PANDASTACK_API_KEY", "   ")
    with pytest.raises(ConfigurationError, match="PANDASTACK_API_KEY"):
        Client()


@pytest.mark.anyio
async def test_missing_api_key_async(monkeypatch):
    monkeypatch.delenv("PANDASTACK_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="PANDASTACK_API_KEY"):
        await AsyncSandbox.create()


def test_api_url_from_env_and_default(monkeypatch):
    monkeypatch.setenv("PANDASTACK_API_KEY", "pds_test")
    monkeypatch.delenv("PANDASTACK_API", raising=False)
    assert Client().api_url == "http://localhost:8080"
    monkeypatch.setenv("PANDASTACK_API", "http://10.1.2.3:9000/")
    assert Client().api_url == "http://10.1.2.3:9000"
    c = Client(api_key="pds_explicit", api_url="http://127.0.0.1:1234")
    assert (c.api_key, c.api_url) == ("pds_explicit", "http://127.0.0.1:1234")
    assert "pds_expl" in repr(c) and "pds_explicit" not in repr(c)


def test_unreachable_server_is_a_connection_error(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PANDASTACK_API_KEY", "pds_test")
    monkeypatch.setenv("PANDASTACK_API", f"http://127.0.0.1:{port}")
    with pytest.raises(APIConnectionError) as ei:
        Sandbox.create()
    assert f"127.0.0.1:{port}" in str(ei.value) and "PANDASTACK_API" in str(ei.value)
    assert ei.value.code == "connection_error" and ei.value.status is None
    assert not Client().health()


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"ttl_seconds": True}, "ttl_seconds"),
        ({"ttl_seconds": 10.5}, "ttl_seconds"),
        ({"ttl_seconds": "ten"}, "ttl_seconds"),
        ({"cpu": "many"}, "cpu"),
        ({"metadata": {"owner": None}}, "metadata['owner']"),
    ],
)
def test_bad_create_arguments_are_refused_before_sending(monkeypatch, kwargs, word):
    # Refused in the SDK, with the server's error class: no request is made (the port is closed).
    monkeypatch.setenv("PANDASTACK_API", "http://127.0.0.1:1")
    monkeypatch.setenv("PANDASTACK_API_KEY", "pds_test")
    with pytest.raises(pandastack.InvalidRequestError) as e:
        Sandbox.create(template="base", **kwargs)
    assert word in str(e.value)


def test_binary_stdin_that_is_not_text_is_refused():
    from pandastack._base import exec_body

    assert exec_body("cat", None, None, None, b"caf\xc3\xa9")["stdin"] == "café"
    with pytest.raises(pandastack.InvalidRequestError, match="UTF-8"):
        exec_body("cat", None, None, None, b"\xff\x00")
