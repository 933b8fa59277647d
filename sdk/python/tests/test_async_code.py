"""Code contexts through the asyncio API, on the code-interpreter template."""

from __future__ import annotations

import asyncio
import time

import pytest

from pandastack import AsyncCodeContext, AsyncSandbox, ConflictError, ExecutionError, NotFoundError, Result

from test_code import png_size

pytestmark = [pytest.mark.anyio, pytest.mark.code_interpreter]


@pytest.fixture
async def asb(server):
    from conftest import CODE_TEMPLATE, require_code_interpreter

    require_code_interpreter(server)
    sb = await AsyncSandbox.create(template=CODE_TEMPLATE, ttl_seconds=600)
    yield sb
    await sb.kill()


async def test_context_state_results_errors(asb):
    ctx = await asb.create_code_context()
    assert isinstance(ctx, AsyncCodeContext) and ctx.id.startswith("ctx_")
    await ctx.run_code("import pandas as pd\ndf = pd.DataFrame({'v': [3, 4]})")
    ex = await ctx.run_code("int(df.v.sum())")
    assert ex.text == "7" and ex.error is None

    ex = await ctx.run_code("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], df.v)\nplt.show()")
    assert ex.png is not None and png_size(ex.png)[0] > 100

    ex = await ctx.run_code("raise RuntimeError('async boom')")
    assert ex.error.name == "RuntimeError" and ex.error.value == "async boom"
    assert "RuntimeError: async boom" in str(ex.error)

    ex = await ctx.run_code("import time\ntime.sleep(30)", timeout=1.5)
    assert ex.error.name == "TimeoutError"
    assert (await ctx.run_code("int(df.v.max())")).text == "4"
    await ctx.close()
    with pytest.raises(NotFoundError):
        await ctx.run_code("1")


async def test_streaming_async_callbacks_in_order(asb):
    ctx = await asb.create_code_context()
    events = []
    start = time.monotonic()

    async def on_stdout(chunk: str) -> None:
        await asyncio.sleep(0)  # a real coroutine callback
        events.append(("stdout", chunk, time.monotonic() - start))

    ex = await ctx.run_code(
        "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)\n{'answer': 42}",
        on_stdout=on_stdout,
        on_result=lambda r: events.append(("result", r, time.monotonic() - start)),
        on_error=lambda e: events.append(("error", e, 0)),
    )
    done = time.monotonic() - start
    assert ex.stdout == "0\n1\n2\n" and ex.text == "{'answer': 42}"
    assert [k for k, _, _ in events if k != "stdout"] == ["result"]
    assert "".join(v for k, v, _ in events if k == "stdout") == "0\n1\n2\n"
    assert events[-1][0] == "result" and isinstance(events[-1][1], Result)
    assert events[0][2] < done - 0.8

    errors = []
    ex = await ctx.run_code("1/0", on_error=errors.append)
    assert len(errors) == 1 and isinstance(errors[0], ExecutionError) and errors[0].name == "ZeroDivisionError"


async def test_interrupt_restart_list_connect(asb):
    ctx = await asb.create_code_context()
    await ctx.run_code("v = 'here'")
    task = asyncio.ensure_future(ctx.run_code("import time\nwhile True: time.sleep(0.1)"))
    await asyncio.sleep(1.5)
    with pytest.raises(ConflictError):
        await ctx.run_code("1")
    await ctx.interrupt()
    ex = await asyncio.wait_for(task, 30)
    assert ex.error.name == "KeyboardInterrupt"

    listed = await asb.list_code_contexts()
    assert ctx.id in [c.id for c in listed]
    again = await AsyncCodeContext.connect(asb, ctx.id)
    assert (await again.run_code("v")).text == "'here'"
    again2 = await AsyncCodeContext.connect(asb.id, ctx.id)
    assert again2.sandbox.id == asb.id

    await ctx.restart()
    assert (await ctx.run_code("v")).error.name == "NameError"
    await ctx.close()
    with pytest.raises(NotFoundError):
        await AsyncCodeContext.connect(asb, ctx.id)


async def test_sandbox_run_code(asb):
    await asb.run_code("z = 5")
    assert (await asb.run_code("z * 2")).text == "10"
    chunks = []
    ex = await asb.run_code("echo hi from bash", language="bash", on_stdout=chunks.append)
    assert "".join(chunks).strip() == "hi from bash" and ex.stdout.strip() == "hi from bash"


async def test_close_after_the_sandbox_stopped(server):
    """As the sync twin: closing the context of a sandbox its TTL stopped is
    not an error."""
    import asyncio

    from conftest import CODE_TEMPLATE, require_code_interpreter

    from pandastack import SandboxStoppedError

    require_code_interpreter(server)
    sb = await AsyncSandbox.create(template=CODE_TEMPLATE, ttl_seconds=5)
    c = await sb.create_code_context()
    for _ in range(120):
        if (await sb.refresh()).state == "stopped":
            break
        await asyncio.sleep(0.5)
    assert sb.state == "stopped", f"the sandbox is still {sb.state} past its TTL"
    await c.close()
    with pytest.raises(SandboxStoppedError):
        await c.run_code("1")
