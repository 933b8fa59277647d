"""The asyncio API (AsyncSandbox) against a real server: life cycle, exec,
files and errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from datetime import timedelta

import pytest

from pandastack import (
    AsyncSandbox,
    AuthenticationError,
    Client,
    CommandNotFoundError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)

pytestmark = pytest.mark.anyio


async def test_lifecycle(server):
    tag = uuid.uuid4().hex
    sb = await AsyncSandbox.create(ttl_seconds=120, metadata={"tag": tag}, env={"A": "1"})
    try:
        assert sb.id.startswith("sbx_") and sb.state == "running" and sb.template == "base"
        assert sb.metadata == {"tag": tag}
        again = await AsyncSandbox.connect(sb.id)
        assert again.id == sb.id
        # the store keeps milliseconds; create answers with full precision
        assert abs(again.expires_at - sb.expires_at) < timedelta(milliseconds=5)
        assert [s.id for s in await AsyncSandbox.list(metadata={"tag": tag})] == [sb.id]
        old = sb.expires_at
        await sb.set_ttl(2400)
        assert sb.expires_at > old + timedelta(seconds=2000)
        assert await sb.is_running()
        assert (await sb.refresh()) is sb
        assert (await sb.exec("echo $A")).stdout == "1\n"
    finally:
        await sb.kill()
    with pytest.raises(NotFoundError) as ei:
        await AsyncSandbox.connect(sb.id)
    assert ei.value.code == "not_found" and ei.value.status == 404
    assert await AsyncSandbox.list(metadata={"tag": tag}) == []
    await sb.kill()


async def test_async_context_manager(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        sid = sb.id
        r = await sb.exec(["python3", "-c", "print(6 * 7)"])
        assert (r.stdout, r.exit_code) == ("42\n", 0)
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect(sid)


async def test_concurrent_sandboxes(server):
    sbs = await asyncio.gather(*(AsyncSandbox.create(ttl_seconds=120) for _ in range(3)))
    try:
        assert len({s.id for s in sbs}) == 3
        outs = await asyncio.gather(*(s.exec(f"echo {i}; sleep 1") for i, s in enumerate(sbs)))
        assert [o.stdout for o in outs] == ["0\n", "1\n", "2\n"]
    finally:
        await asyncio.gather(*(s.kill() for s in sbs))


async def test_exec_timeout_and_stdin(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        r = await sb.exec("cat; sleep 30", stdin="piped\n", timeout=1)
        assert r.timed_out and r.stdout == "piped\n"
        r = await sb.exec("pwd; echo $V", cwd="/tmp", env={"V": "v"})
        assert r.stdout == "/tmp\nv\n"


async def test_exec_streaming_with_sync_and_async_callbacks(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        got = []
        start = time.monotonic()

        async def on_out(chunk: str) -> None:
            got.append(("out", chunk, time.monotonic() - start))

        r = await sb.exec(
            "for i in 1 2 3; do echo n$i; sleep 0.5; done; echo e >&2",
            on_stdout=on_out,
            on_stderr=lambda c: got.append(("err", c, time.monotonic() - start)),
        )
        done = time.monotonic() - start
        assert r.exit_code == 0 and r.stdout == "n1\nn2\nn3\n" and r.stderr == "e\n"
        assert "".join(c for k, c, _ in got if k == "out") == r.stdout
        assert got[-1][:2] == ("err", "e\n")
        assert got[0][2] < done - 0.8


async def test_files_roundtrip(server, tmp_path):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        info = await sb.files.write("a/b/c.txt", "async text")
        assert info.path == "/home/user/a/b/c.txt" and info.size == 10
        assert await sb.files.read("a/b/c.txt") == b"async text"
        assert await sb.files.read_text("/home/user/a/b/c.txt") == "async text"
        await sb.files.mkdir("a/d")
        assert [f.name for f in await sb.files.list("a")] == ["b", "d"]
        assert (await sb.files.stat("a/d")).type == "dir"
        assert (await sb.files.rename("a/d", "a/e")).path == "/home/user/a/e"
        st = await sb.stats()
        assert st.memory_limit_bytes == sb.memory_mb << 20 and st.memory_bytes > 0
        assert [f.name for f in await sb.files.list("a")] == ["b", "e"]
        assert await sb.files.exists("a/b/c.txt")

        src = tmp_path / "up.bin"
        data = os.urandom(5 * (1 << 20) + 123)
        src.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        up = await sb.files.upload(src, "up.bin")
        assert up.size == len(data)
        assert (await sb.exec("sha256sum up.bin")).stdout.split()[0] == digest
        dst = tmp_path / "down.bin"
        assert await sb.files.download("up.bin", dst) == len(data)
        assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest

        with pytest.raises(ConflictError):
            await sb.files.remove("a")
        await sb.files.remove("a", recursive=True)
        assert not await sb.files.exists("a")
        with pytest.raises(NotFoundError):
            await sb.files.read("a/b/c.txt")
        await sb.kill()
        with pytest.raises(NotFoundError):  # the sandbox is gone, not the file
            await sb.files.exists("a")


async def test_errors(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        with pytest.raises(CommandNotFoundError) as ei:
            await sb.exec(["definitely-not-here"])
        assert ei.value.code == "command_not_found" and ei.value.status == 400
        with pytest.raises(InvalidRequestError):
            await sb.exec("true", timeout=0)
    bad = Client(api_key="pds_" + "y" * 32, api_url=server.url)
    with pytest.raises(AuthenticationError) as ei2:
        await AsyncSandbox.create(client=bad)
    assert ei2.value.code == "unauthorized" and ei2.value.status == 401
    await bad.aclose()


async def test_explicit_client_and_templates(server):
    async with Client(api_key=server.api_key, api_url=server.url) as c:
        assert "base" in [t.name for t in await c.alist_templates()]
        sb = await AsyncSandbox.create(ttl_seconds=60, client=c)
        assert sb.client is c
        await sb.kill()


async def test_commands_e2b_names(server):
    # The same E2B names as Sandbox.commands, as coroutines.
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        r = await sb.commands.run("echo ran")
        assert (r.stdout, r.exit_code) == ("ran\n", 0)
        h = await sb.commands.run("read line; echo got $line", background=True)
        assert [p.pid for p in await sb.commands.list() if p.running] == [h.pid]
        again = await sb.commands.connect(h.pid)
        assert again.pid == h.pid
        await sb.commands.send_stdin(h.pid, "it\n")
        assert (await again.wait()).stdout == "got it\n"
        assert await again.output() == ("got it\n", "")
        cat = await sb.commands.run("cat; echo closed >&2", background=True)
        await cat.send_stdin("typed\n")
        await cat.close_stdin()
        await cat.wait()
        assert await cat.output() == ("typed\n", "closed\n")
        sleeper = await sb.commands.run("sleep 600", background=True)
        await sb.commands.kill(sleeper.pid)
        assert (await sleeper.wait()).exit_code != 0
        stray = await sb.commands.run("sleep 601", background=True)
        killed = await sb.commands.kill_all()
        assert killed.killed >= 1 and killed.remaining == 0
        assert (await stray.wait()).signal == "SIGKILL"
        with pytest.raises(NotFoundError):
            await sb.connect_process(999999)


async def test_files_watch_dir(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        await sb.files.mkdir("w")
        got = []

        async def on_event(ev):
            got.append((ev.type, ev.name))

        async with await sb.files.watch_dir("w", on_event=on_event) as w:
            assert w.running
            await sb.exec("echo hi > w/f.txt && rm w/f.txt")
            for _ in range(400):
                if ("remove", "f.txt") in got:
                    break
                await asyncio.sleep(0.05)
            assert ("create", "f.txt") in got and ("remove", "f.txt") in got, got
            assert [(e.type, e.name) for e in w.get_new_events()] == got
        assert not w.running
        with pytest.raises(NotFoundError):
            await sb.files.watch_dir("nope")
