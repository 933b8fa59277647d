"""The SDK's own parsing of the API's JSON shapes (no server needed): the
corner cases a live server rarely produces."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from pandastack import (
    ConflictError,
    Execution,
    ExecutionError,
    InternalServerError,
    NotFoundError,
    PandaStackError,
    Result,
    SandboxStoppedError,
    SandboxUnavailableError,
    StreamError,
    TemplateNotBuiltError,
    InsufficientMemoryError,
)
from pandastack._base import CodeStreamParser, ExecStreamParser, create_body, exec_body
from pandastack.exceptions import error_from_response
from pandastack.models import parse_time


def test_parse_time_nanoseconds_and_zone():
    assert parse_time("2026-01-02T15:04:05.123456789Z") == datetime(2026, 1, 2, 15, 4, 5, 123456, tzinfo=timezone.utc)
    assert parse_time("2026-01-02T15:04:05Z") == datetime(2026, 1, 2, 15, 4, 5, tzinfo=timezone.utc)
    assert parse_time("2026-01-02T15:04:05.5+02:00").utcoffset().total_seconds() == 7200
    assert parse_time(None) is None and parse_time("") is None


def test_execution_error_str_names_the_exception():
    tb = "Traceback (most recent call last):\n  File x, line 1\nValueError: bad"
    assert str(ExecutionError("ValueError", "bad", tb)) == tb
    # errors the server makes up may have no traceback, or one without the name
    assert str(ExecutionError("TimeoutError", "ran past 2 s", "")) == "TimeoutError: ran past 2 s"
    assert str(ExecutionError("KernelDied", "", "")) == "KernelDied"
    s = str(ExecutionError("TimeoutError", "ran past 2 s", "  File x, line 3\n    time.sleep(60)\n"))
    assert s.endswith("TimeoutError: ran past 2 s") and "time.sleep(60)" in s


def test_execution_text_and_png_fall_back_to_results():
    ex = Execution.from_dict({
        "execution_count": 3, "stdout": "", "stderr": "", "error": None, "duration_ms": 5,
        "results": [
            {"is_main_result": False, "png": "AAA", "text": "<Figure>"},
            {"is_main_result": True, "text": "42", "json": {"a": 1}, "extra": {"application/x-thing": "t"}},
        ],
    })
    assert ex.text == "42" and ex.png == "AAA" and ex.execution_count == 3
    assert ex.main_result.json == {"a": 1}
    assert ex.main_result.formats() == ["text", "json", "application/x-thing"]
    assert str(ex.results[1]) == "42"
    empty = Execution.from_dict({"results": None, "error": None})
    assert (empty.text, empty.png, empty.results, empty.stdout) == (None, None, [], "")


def test_result_fields():
    r = Result.from_dict({"is_main_result": True, "html": "<b>x</b>", "plotly": {"data": []}, "latex": "$x$"})
    assert (r.html, r.plotly, r.latex, r.text) == ("<b>x</b>", {"data": []}, "$x$", None)
    assert r._repr_html_() == "<b>x</b>"


def test_errors_by_code_then_status():
    assert type(error_from_response("template_not_built", "m", 409)) is TemplateNotBuiltError
    assert isinstance(error_from_response("template_not_built", "m", 409), ConflictError)
    assert type(error_from_response(None, "bad gateway", 502)) is InternalServerError
    assert type(error_from_response(None, "m", 404)) is NotFoundError
    assert type(error_from_response("sandbox_stopped", "m", 410)) is SandboxStoppedError
    assert type(error_from_response(None, "m", 410)) is SandboxStoppedError
    e = error_from_response("insufficient_memory", "m", 503)
    assert type(e) is InsufficientMemoryError and e.status == 503
    e = error_from_response("brand_new_code", "m", 418)
    assert type(e) is PandaStackError and e.code == "brand_new_code" and e.status == 418


def test_code_stream_parser():
    p = CodeStreamParser()
    assert p.feed('{"type":"stdout","data":"a"}') == ("on_stdout", "a")
    act = p.feed('{"type":"result","result":{"is_main_result":true,"text":"1"}}')
    assert act[0] == "on_result" and act[1].text == "1"
    assert p.feed('{"type":"something_new"}') is None
    p.feed('{"type":"execution","execution":{"stdout":"a","error":{"name":"E","value":"v","traceback":""},"results":[]}}')
    ex, owed = p.finish()
    # the error was only in the final execution: on_error is still owed
    assert ex.error.name == "E" and owed == [("on_error", ex.error)]


def test_code_stream_parser_failures():
    p = CodeStreamParser()
    with pytest.raises(SandboxUnavailableError) as ei:
        p.feed('{"type":"error","error":{"error":{"code":"sandbox_unavailable","message":"gone"}}}')
    assert ei.value.code == "sandbox_unavailable" and ei.value.message == "gone"
    with pytest.raises(SandboxStoppedError) as ei:
        CodeStreamParser().feed('{"type":"error","error":{"error":{"code":"sandbox_stopped","message":"killed"}}}')
    assert ei.value.code == "sandbox_stopped" and ei.value.message == "killed"
    with pytest.raises(StreamError):
        CodeStreamParser().finish()
    with pytest.raises(StreamError):
        CodeStreamParser().feed("not json")


def test_exec_stream_parser_flat_error_too():
    p = ExecStreamParser()
    p.feed('{"type":"stdout","data":"x"}')
    with pytest.raises(SandboxUnavailableError):
        p.feed('{"type":"error","error":{"code":"sandbox_unavailable","message":"gone"}}')
    p = ExecStreamParser()
    p.feed('{"type":"stderr","data":"e"}')
    p.feed('{"type":"exit","exit_code":-1,"signal":"SIGKILL","timed_out":true,"duration_ms":7}')
    r = p.finish()
    assert (r.stderr, r.exit_code, r.signal, r.timed_out, r.duration_ms) == ("e", -1, "SIGKILL", True, 7)


def test_request_bodies():
    assert create_body("base", None, None, None, None, None, None) == {"template": "base"}
    # a restore takes the snapshot's template
    assert create_body("base", 60, {"a": 1}, None, "snap_x", None, None, True) == {
        "snapshot_id": "snap_x", "ttl_seconds": 60, "metadata": {"a": "1"}, "auto_resume": True}
    assert create_body("base", None, None, None, None, None, None, None, 0) == {"template": "base", "idle_timeout_seconds": 0}
    assert exec_body("ls", None, None, None, None) == {"cmd": "ls"}
    assert exec_body(("ls", "-l"), 2, {"A": "b"}, "/tmp", b"in") == {
        "argv": ["ls", "-l"], "timeout_seconds": 2.0, "env": {"A": "b"}, "cwd": "/tmp", "stdin": "in"}
    with pytest.raises(ValueError):
        exec_body([], None, None, None, None)


def test_format_execution_keeps_a_value_that_stdout_only_contains():
    from pandastack.integrations._kernel import format_execution

    def ex(stdout, text):
        return Execution.from_dict({"stdout": stdout, "results": [{"is_main_result": True, "text": text}], "text": text})

    assert format_execution(ex("100\n", "1")) == "100\n\n[result] 1"
    assert format_execution(ex("count: 10\n", "10")) == "count: 10\n\n[result] 10"
    assert format_execution(ex("42\n", "42")) == "42"  # print(x); x
    assert format_execution(ex("a\n   x\n0  1\n", "   x\n0  1")) == "a\n   x\n0  1"  # print(df); df
    assert format_execution(ex("", "7")) == "[result] 7"


def test_format_execution_bounds_long_output_and_keeps_stderr_on_error():
    from pandastack.integrations._kernel import OUTPUT_HEAD, OUTPUT_TAIL, format_execution

    # A long stdout keeps its head and tail, with what was left out between.
    out = "é" * 300_000 + "THE END\n"
    text = format_execution(Execution.from_dict({"stdout": out}))
    size = len(out.encode())
    assert len(text.encode()) < OUTPUT_HEAD + OUTPUT_TAIL + 200 < size
    assert text.startswith("é" * 1000) and text.endswith("THE END")
    assert "\ufffd" not in text  # no character cut in two
    left = int(text.split("[… ")[1].split(" bytes")[0])
    kept = len(text.encode()) - len(text.split("\n[… ")[1].split("]\n")[0].encode()) - len("\n[… ]\n".encode())
    assert left + kept == size - 1  # rstrip() dropped the last newline
    # An error shows stderr too: the reason a subprocess failed is there.
    failed = Execution.from_dict({
        "stdout": "before\n",
        "stderr": "ls: cannot access '/nope': No such file or directory\n",
        "error": {"name": "CalledProcessError", "value": "exit status 2", "traceback": "Traceback …\nCalledProcessError: exit status 2"},
    })
    text = format_execution(failed)
    assert text.startswith("ERROR:\n") and "stdout:\nbefore" in text
    assert text.endswith("[stderr]\nls: cannot access '/nope': No such file or directory")


def test_format_execution_bounds_errors_and_results():
    from pandastack.integrations._kernel import OUTPUT_HEAD, OUTPUT_TAIL, format_execution

    huge = "é" * (1 << 20)
    err = Execution.from_dict({"error": {"name": "ValueError", "value": huge, "traceback": "ValueError: " + huge}})
    text = format_execution(err)
    assert len(text.encode()) < OUTPUT_HEAD + OUTPUT_TAIL + 300 and "bytes of output left out" in text
    res = Execution.from_dict({"results": [{"is_main_result": True, "text": huge}], "text": huge})
    text = format_execution(res)
    assert len(text.encode()) < OUTPUT_HEAD + OUTPUT_TAIL + 300 and text.startswith("[result] éé")


def test_format_execution_shows_displays_and_what_a_terminal_leaves():
    from pandastack.integrations._kernel import CHART_MARKER, format_execution

    ex = Execution.from_dict({
        "stdout": "\x1b[32mloading\x1b[0m\n 0%|   | 0/3\r 33%|#  | 1/3\r100%|###| 3/3\n\rstep 1\rstep 2\rdone\n",
        "results": [
            {"text": "   a\n0  1", "html": "<table/>"},  # display(df)
            {"text": "<IPython.core.display.Markdown object>", "markdown": "**42**"},
            {"text": "<IPython.core.display.JSON object>", "json": {"k": "v"}},
            {"text": "<Figure size 640x480 with 1 Axes>", "png": "iVBO"},
            {"is_main_result": True, "text": "<IPython.core.display.Latex object>", "latex": "$x^2$"},
        ],
    })
    assert format_execution(ex) == (
        "loading\n100%|###| 3/3\ndone\n\n[display]    a\n0  1\n\n[display] **42**\n\n"
        '[display] {"k": "v"}\n\n[result] $x^2$\n\n' + CHART_MARKER
    )
    # On an error, what was displayed before it is kept.
    failed = Execution.from_dict({
        "stdout": "x\n",
        "results": [{"text": "   a\n0  1"}],
        "error": {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "ZeroDivisionError: division by zero"},
    })
    assert format_execution(failed) == "ERROR:\nZeroDivisionError: division by zero\n\nstdout:\nx\n\n[display]    a\n0  1"
    # A repr with nothing better stays; a figure's repr alone gives the chart marker only.
    assert format_execution(Execution.from_dict({"results": [{"is_main_result": True, "text": "<Thing id=3>"}]})) == "[result] <Thing id=3>"
    assert format_execution(Execution.from_dict({"results": [{"is_main_result": True, "text": "<Figure size 640x480 with 1 Axes>", "png": "iVBO"}]})) == CHART_MARKER


def test_format_execution_bounds_the_displays_as_a_whole():
    from pandastack.integrations._kernel import OUTPUT_HEAD, OUTPUT_TAIL, format_execution

    ex = Execution.from_dict({"results": [{"text": f"row {i} " + "x" * 1000} for i in range(1000)]})
    text = format_execution(ex)
    assert len(text.encode()) < OUTPUT_HEAD + OUTPUT_TAIL + 300
    assert text.startswith("[display] row 0 ") and "row 999 " in text and "bytes of output left out" in text
