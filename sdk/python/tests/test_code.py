"""Code contexts (persistent kernels) through the synchronous API, on the
code-interpreter template."""

from __future__ import annotations

import base64
import struct
import threading
import time

import pytest

from pandastack import (
    CodeContext,
    ConflictError,
    Execution,
    ExecutionError,
    InvalidRequestError,
    NotFoundError,
    Result,
)

pytestmark = pytest.mark.code_interpreter


def png_size(b64: str) -> tuple:
    """Width and height of a base64 PNG, checking its signature and IHDR."""
    raw = base64.b64decode(b64, validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", raw[:16]
    length, kind = struct.unpack(">I4s", raw[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", raw[16:24])


@pytest.fixture(scope="module")
def ctx(code_sandbox) -> CodeContext:
    c = code_sandbox.create_code_context()
    yield c
    c.close()


def test_create_code_context(code_sandbox):
    c = code_sandbox.create_code_context(language="python", cwd="/tmp", env={"CTX_VAR": "from-ctx"})
    try:
        assert isinstance(c, CodeContext)
        assert c.id.startswith("ctx_") and c.language == "python" and c.cwd == "/tmp"
        assert c.sandbox is code_sandbox
        ex = c.run_code("import os\n(os.getcwd(), os.environ['CTX_VAR'])")
        assert ex.error is None, ex.error
        assert ex.text == "('/tmp', 'from-ctx')"
    finally:
        c.close()


def test_state_persists_and_main_result(ctx):
    first = ctx.run_code("x = 41\nimport math")
    assert isinstance(first, Execution)
    assert first.error is None and first.text is None and first.results == []
    ex = ctx.run_code("x + 1")
    assert ex.text == "42"
    assert ex.error is None
    assert len(ex.results) == 1 and ex.results[0].is_main_result and ex.results[0].text == "42"
    assert ex.main_result is ex.results[0]
    assert ex.execution_count == first.execution_count + 1
    assert ex.duration_ms >= 0
    assert ctx.run_code("math.sqrt(x + 40)").text == "9.0"


def test_stdout_and_stderr(ctx):
    ex = ctx.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    assert ex.stdout == "to out\n"
    assert ex.stderr == "to err\n"
    assert ex.text is None


def test_exception_is_an_execution_error(ctx):
    ex = ctx.run_code("def f():\n    return 1 / 0\nf()")
    err = ex.error
    assert isinstance(err, ExecutionError)
    assert err.name == "ZeroDivisionError"
    assert err.value == "division by zero"
    assert "f()" in err.traceback and "\x1b[" not in err.traceback
    text = str(err)
    assert text == err.traceback.rstrip()
    assert "ZeroDivisionError" in text and "division by zero" in text
    assert f"ERROR:\n{err}".startswith("ERROR:\n")
    # the kernel is fine afterwards
    assert ctx.run_code("x").text == "41"


def test_syntax_error(ctx):
    ex = ctx.run_code("def (")
    assert ex.error is not None and ex.error.name == "SyntaxError"
    assert "SyntaxError" in str(ex.error)


def test_streaming_callbacks_in_order(ctx):
    events = []
    start = time.monotonic()

    def record(kind):
        return lambda v: events.append((kind, v, time.monotonic() - start))

    ex = ctx.run_code(
        "import sys, time\n"
        "for i in range(4):\n"
        "    print(f'tick {i}', flush=True)\n"
        "    time.sleep(0.4)\n"
        "print('warn', file=sys.stderr, flush=True)\n"
        "'done'",
        on_stdout=record("stdout"),
        on_stderr=record("stderr"),
        on_result=record("result"),
        on_error=record("error"),
    )
    returned = time.monotonic() - start
    assert ex.error is None and ex.text == "'done'"
    kinds = [k for k, _, _ in events]
    assert "error" not in kinds
    outs = "".join(v for k, v, _ in events if k == "stdout")
    assert outs == "tick 0\ntick 1\ntick 2\ntick 3\n" == ex.stdout
    assert "".join(v for k, v, _ in events if k == "stderr") == "warn\n"
    # every stdout chunk came before the final result, which came last
    assert kinds[-1] == "result"
    assert max(i for i, k in enumerate(kinds) if k == "stdout") < kinds.index("result")
    res = events[-1][1]
    assert isinstance(res, Result) and res.is_main_result and res.text == "'done'"
    # and live: the first tick long before the run ended
    first_tick = next(t for k, _, t in events if k == "stdout")
    assert first_tick < returned - 1.0, events


def test_streaming_on_error(ctx):
    seen = []
    ex = ctx.run_code("print('before')\nraise KeyError('missing')", on_error=seen.append, on_stdout=seen.append)
    assert seen[0] == "before\n"
    assert len(seen) == 2 and isinstance(seen[1], ExecutionError)
    assert seen[1].name == "KeyError" and seen[1] == ex.error


def test_chart_png_and_dataframe_html(ctx):
    ex = ctx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert ex.error is None, ex.error
    assert ex.png is not None
    w, h = png_size(ex.png)
    assert w > 100 and h > 100
    assert any(r.png == ex.png and not r.is_main_result for r in ex.results)

    ex = ctx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert ex.error is None, ex.error
    main = ex.main_result
    assert main is not None and main.html is not None and "<table" in main.html
    assert "a" in ex.text and "b" in ex.text
    assert "html" in main.formats() and "text" in main.formats()


def test_json_result(ctx):
    ex = ctx.run_code("from IPython.display import JSON, display\ndisplay(JSON({'k': [1, 2]}))")
    assert ex.error is None, ex.error
    assert any(r.json == {"k": [1, 2]} for r in ex.results), ex.results


def test_timeout_interrupts_and_keeps_state(ctx):
    start = time.monotonic()
    ex = ctx.run_code("print('started', flush=True)\nimport time\ntime.sleep(60)", timeout=2)
    assert time.monotonic() - start < 20
    assert ex.error is not None and ex.error.name == "TimeoutError"
    assert "TimeoutError" in str(ex.error)
    assert ex.stdout == "started\n"
    assert ctx.run_code("x").text == "41"


def test_env_per_run(ctx):
    ex = ctx.run_code("import os\nos.environ.get('RUN_ONLY')", env={"RUN_ONLY": "yes"})
    assert ex.text == "'yes'"


def test_interrupt(code_sandbox):
    c = code_sandbox.create_code_context()
    try:
        out = {}

        def long_run():
            out["ex"] = c.run_code("import time\nfor _ in range(600):\n    time.sleep(0.1)")

        t = threading.Thread(target=long_run)
        t.start()
        time.sleep(1.5)
        # a context runs one cell at a time
        with pytest.raises(ConflictError) as ei:
            c.run_code("1")
        assert ei.value.code == "conflict" and ei.value.status == 409
        c.interrupt()
        t.join(30)
        assert not t.is_alive()
        assert out["ex"].error is not None and out["ex"].error.name == "KeyboardInterrupt"
        assert c.run_code("2 + 2").text == "4"
    finally:
        c.close()


def test_restart_loses_state(code_sandbox):
    c = code_sandbox.create_code_context()
    try:
        c.run_code("kept = 1")
        c.restart()
        ex = c.run_code("kept")
        assert ex.error is not None and ex.error.name == "NameError"
        assert c.run_code("3 * 3").text == "9"
    finally:
        c.close()


def test_list_connect_close(code_sandbox):
    c = code_sandbox.create_code_context()
    c.run_code("marker = 'reattached'")
    ids = [x.id for x in code_sandbox.list_code_contexts()]
    assert c.id in ids
    assert all(isinstance(x, CodeContext) for x in code_sandbox.list_code_contexts())

    again = CodeContext.connect(code_sandbox, c.id)
    assert again.id == c.id and again.language == "python"
    assert again.run_code("marker").text == "'reattached'"
    by_id = CodeContext.connect(code_sandbox.id, c.id)
    assert by_id.run_code("marker").text == "'reattached'"

    c.close()
    assert c.id not in [x.id for x in code_sandbox.list_code_contexts()]
    with pytest.raises(NotFoundError) as ei:
        c.run_code("1")
    assert ei.value.code == "not_found" and ei.value.status == 404
    with pytest.raises(NotFoundError):
        CodeContext.connect(code_sandbox, c.id)
    c.close()  # closing twice is fine


def test_sandbox_run_code_default_context(code_sandbox):
    code_sandbox.run_code("shared = 'default ctx'")
    ex = code_sandbox.run_code("shared")
    assert ex.text == "'default ctx'"
    chunks = []
    ex = code_sandbox.run_code("print(shared.upper())", on_stdout=chunks.append)
    assert chunks == ["DEFAULT CTX\n"] and ex.stdout == "DEFAULT CTX\n"
    bash = code_sandbox.run_code("echo from-bash $((6 * 7))", language="bash")
    assert bash.stdout.strip() == "from-bash 42", bash


def test_run_code_in_named_context(code_sandbox, ctx):
    assert code_sandbox.run_code("x", context=ctx).text == "41"
    assert code_sandbox.run_code("x", context=ctx.id).text == "41"


def test_bad_language(code_sandbox):
    with pytest.raises(InvalidRequestError) as ei:
        code_sandbox.create_code_context(language="cobol")
    assert ei.value.code == "invalid_request" and "cobol" in ei.value.message


def test_close_after_the_sandbox_stopped(server):
    """The recipe's clean-up, ``ctx.close()``, after its sandbox's TTL ran
    out: the sandbox is stopped (its record stays a while), and closing its
    context is not an error; using it is."""
    from conftest import require_code_interpreter

    from pandastack import Sandbox, SandboxStoppedError

    require_code_interpreter(server)
    sb = Sandbox.create(template="code-interpreter", ttl_seconds=5)
    c = sb.create_code_context()
    deadline = time.monotonic() + 60
    while sb.refresh().state != "stopped":
        assert time.monotonic() < deadline, f"the sandbox is still {sb.state} past its TTL"
        time.sleep(0.5)
    c.close()
    with pytest.raises(SandboxStoppedError):
        c.run_code("1")
