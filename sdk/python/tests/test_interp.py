"""Structured chart and table data, more output kinds, background commands
and E2B's names, through the synchronous API against a real server."""

from __future__ import annotations

import pytest

from pandastack import CommandHandle, ConflictError, ExecResult, NotFoundError, ProcessesKilled, ProcessInfo, Sandbox

from test_code import png_size


def one_with(ex, attr):
    found = [r for r in ex.results if getattr(r, attr) is not None]
    assert len(found) == 1, [r.formats() for r in ex.results]
    return found[0]


@pytest.mark.code_interpreter
def test_line_chart(code_sandbox: Sandbox):
    ex = code_sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('Squares'); plt.xlabel('n')\n"
        "plt.show()"
    )
    assert ex.error is None, ex.error
    r = one_with(ex, "chart")
    assert r.formats()[:2] == ["text", "png"] and "chart" in r.formats()
    assert png_size(r.png)[0] > 100
    c = r.chart
    assert (c["type"], c["title"], c["x_label"], c["x_scale"]) == ("line", "Squares", "n", "linear")
    assert c["elements"] == [{"label": "squares", "points": [[1, 1], [2, 4], [3, 9]]}]


@pytest.mark.code_interpreter
def test_bar_and_box_charts(code_sandbox: Sandbox):
    ex = code_sandbox.run_code("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5]); plt.show()")
    assert one_with(ex, "chart").chart["elements"] == [
        {"label": "a", "value": 3, "group": None},
        {"label": "b", "value": 5, "group": None},
    ]
    ex = code_sandbox.run_code("plt.boxplot([[1, 2, 3, 4, 5]]); plt.show()")
    (box,) = one_with(ex, "chart").chart["elements"]
    assert (box["min"], box["first_quartile"], box["median"], box["third_quartile"], box["max"]) == (1, 2, 3, 4, 5)


@pytest.mark.code_interpreter
def test_dataframe_data(code_sandbox: Sandbox):
    ex = code_sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None]})")
    r = ex.main_result
    assert r is not None and "data" in r.formats() and "<table" in r.html
    assert r.data["columns"] == ["a", "b"]
    assert r.data["rows"] == [[1, "x"], [2, None]]
    assert r.data["total_rows"] == 2 and "truncated" not in r.data


@pytest.mark.code_interpreter
def test_pil_and_display_formats(code_sandbox: Sandbox):
    ex = code_sandbox.run_code("from PIL import Image\nImage.new('RGB', (20, 10), 'blue').show()")
    assert png_size(one_with(ex, "png").png) == (20, 10)
    ex = code_sandbox.run_code(
        "from IPython.display import display, JSON, Latex, Markdown\n"
        "display(JSON({'k': 1})); display(Latex('$y$')); display(Markdown('# T'))"
    )
    assert [r.formats() for r in ex.results] == [["text", "json"], ["text", "latex"], ["text", "markdown"]]
    assert (ex.results[0].json, ex.results[1].latex, ex.results[2].markdown) == ({"k": 1}, "$y$", "# T")


def test_background_command(sandbox: Sandbox):
    h = sandbox.exec("echo ready; read name; echo hi $name >&2; echo done", background=True)
    assert isinstance(h, CommandHandle) and h.pid > 0 and h.info.running
    procs = sandbox.list_processes()
    assert [p.pid for p in procs] == [h.pid] and isinstance(procs[0], ProcessInfo)
    h.send_stdin("panda\n")
    seen = list(h)
    # How the output is cut into chunks is not part of the contract.
    assert "".join(d for k, d in seen if k == "stdout") == "ready\ndone\n"
    assert "".join(d for k, d in seen if k == "stderr") == "hi panda\n"
    res = h.wait()
    assert isinstance(res, ExecResult)
    assert (res.stdout, res.stderr, res.exit_code) == ("ready\ndone\n", "hi panda\n", 0)
    assert not h.info.running and h.info.exit_code == 0
    with pytest.raises(ConflictError):
        h.send_stdin("late")


def test_background_kill_and_connect(sandbox: Sandbox):
    h = sandbox.exec(["sleep", "600"], background=True)
    again = sandbox.connect_process(h.pid)
    assert again.info.cmd == "sleep 600" and again.info.running
    again.kill()
    res = h.wait()
    assert res.signal == "SIGKILL" and not res.ok
    with pytest.raises(NotFoundError):
        sandbox.connect_process(999999)


def test_e2b_names(sandbox: Sandbox):
    res = sandbox.commands.run("echo via-alias")
    assert isinstance(res, ExecResult) and res.stdout == "via-alias\n"
    h = sandbox.commands.run("sleep 600", background=True)
    assert [p.pid for p in sandbox.commands.list() if p.running] == [h.pid]
    sandbox.commands.kill(h.pid)
    assert h.wait().signal == "SIGKILL"
    before = sandbox.refresh().expires_at
    sandbox.set_timeout(3000)
    assert sandbox.expires_at > before


@pytest.mark.code_interpreter
def test_kill_all_processes_keeps_the_kernels(code_sandbox: Sandbox):
    ctx = code_sandbox.create_code_context(language="python")
    try:
        ctx.run_code("import subprocess\nx = 41\nchild = subprocess.Popen(['sleep', '602'])")
        h = code_sandbox.exec("sleep 600", background=True)
        code_sandbox.exec("setsid sleep 601 </dev/null >/dev/null 2>&1 &")  # a daemon
        killed = code_sandbox.commands.kill_all()
        assert isinstance(killed, ProcessesKilled) and killed.killed >= 3 and killed.remaining == 0
        assert h.wait().signal == "SIGKILL"
        ex = ctx.run_code("print(x + 1, child.wait())")
        assert ex.error is None and ex.stdout == "42 -9\n"
        left = code_sandbox.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep 60' || true")
        assert left.stdout == "0\n"
    finally:
        ctx.close()


@pytest.mark.code_interpreter
def test_execution_logs(code_sandbox: Sandbox):
    ex = code_sandbox.run_code("import sys; print('out'); print('err', file=sys.stderr)")
    assert ex.logs.stdout == ["out\n"] and ex.logs.stderr == ["err\n"]
    assert "".join(ex.logs.stdout) == ex.stdout
    assert code_sandbox.run_code("1").logs.stdout == []


@pytest.mark.anyio
async def test_async_set_timeout(server):
    from pandastack import AsyncSandbox

    sb = await AsyncSandbox.create(ttl_seconds=120)
    try:
        before = sb.expires_at
        await sb.set_timeout(3000)
        assert sb.expires_at > before
    finally:
        await sb.kill()


@pytest.mark.code_interpreter
def test_languages(code_sandbox: Sandbox):
    ex = code_sandbox.run_code("const n: number = await Promise.resolve(6); n * 7", language="typescript")
    assert ex.error is None and ex.text == "42", ex
    ctx = code_sandbox.create_code_context(language="javascript")
    try:
        ex = ctx.run_code('import { chunk } from "npm:lodash-es@4.17.21"; chunk([1, 2, 3], 2).length', env={"X": "1"})
        assert ex.error is None and ex.text == "2", ex
    finally:
        ctx.close()
    ex = code_sandbox.run_code('cat(Sys.getenv("GREETING"))', language="r", env={"GREETING": "hi from R"})
    assert ex.error is None and ex.stdout == "hi from R", ex
    langs = [c.language for c in code_sandbox.list_code_contexts()]
    assert "typescript" in langs and "r" in langs and "javascript" not in langs


@pytest.mark.code_interpreter
def test_java(code_sandbox: Sandbox):
    ex = code_sandbox.run_code(
        'var xs = java.util.List.of(1, 2, 3);\nSystem.out.println(System.getenv("V"));',
        language="java",
        env={"V": "env-ok"},
        timeout=180,
    )
    assert ex.error is None and ex.stdout == "env-ok\n", ex
    ex = code_sandbox.run_code("xs.stream().mapToInt(Integer::intValue).sum() * 7", language="java")
    assert ex.error is None and ex.text == "42", ex
    ex = code_sandbox.run_code('throw new IllegalStateException("bad")', language="java")
    assert ex.error is not None and "bad" in ex.error.value, ex


@pytest.mark.anyio
async def test_async_background_command(server):
    from pandastack import AsyncCommandHandle, AsyncSandbox

    sb = await AsyncSandbox.create(ttl_seconds=120)
    try:
        h = await sb.exec("read x; echo got $x", background=True)
        assert isinstance(h, AsyncCommandHandle) and h.info.running
        assert [p.pid for p in await sb.list_processes()] == [h.pid]
        await h.send_stdin("async\n")
        seen = [chunk async for chunk in h]
        assert seen == [("stdout", "got async\n")]
        res = await h.wait()
        assert (res.stdout, res.exit_code) == ("got async\n", 0) and not h.info.running
        h = await sb.exec("sleep 600", background=True)
        await sb.kill_process(h.pid)
        assert (await h.wait()).signal == "SIGKILL"
    finally:
        await sb.kill()
