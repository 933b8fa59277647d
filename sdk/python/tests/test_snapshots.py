"""Snapshots, restore, fork and pause/resume.

The headline test snapshots a sandbox in one Python process and restores it
from the snapshot id in another, with the kernel's variables back. If the
server has no snapshot endpoints (it answers 404 "no route"), these tests
skip on a developer machine and fail under CI=true.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import CI, CODE_TEMPLATE, require_code_interpreter
from pandastack import (
    AsyncSandbox,
    CodeContext,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    SnapshotInfo,
)

pytestmark = pytest.mark.snapshots

NO_ROUTE = "no route"


def no_endpoint(e: NotFoundError) -> None:
    msg = f"the server has no snapshot endpoints ({e.message}); they are part of the SDK's contract"
    if CI:
        pytest.fail(msg + " (CI=true)", pytrace=False)
    pytest.skip(msg)


def snapshot(sb: Sandbox, **kw) -> SnapshotInfo:
    try:
        return sb.snapshot_info(**kw)
    except NotFoundError as e:
        if e.message.startswith(NO_ROUTE):
            no_endpoint(e)
        raise


def run_process(script: str, *args: str) -> dict:
    """Run a Python script in a new process (same env: PANDASTACK_API and
    PANDASTACK_API_KEY point at the test server); return its JSON output."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"process failed ({p.returncode}):\n{p.stderr}\n{p.stdout}"
    return json.loads(p.stdout.strip().splitlines()[-1])


SNAPSHOT_PROCESS = """
    import json
    from pandastack import NotFoundError, Sandbox

    sb = Sandbox.create(template="code-interpreter", ttl_seconds=600, metadata={"suite": "sdk-python-snap"})
    try:
        ctx = sb.create_code_context()
        ex = ctx.run_code(
            "import fractions, os\\n"
            "secret = 41\\n"
            "half = fractions.Fraction(1, 2)\\n"
            "data = {'k': [1, 2, 3]}\\n"
            "os.makedirs('work', exist_ok=True); os.chdir('work')"
        )
        assert ex.error is None, ex.error
        sb.files.write("notes.txt", "kept across processes")
        try:
            snap = sb.snapshot(metadata={"suite": "sdk-python"})
        except NotFoundError as e:
            print(json.dumps({"missing": e.message}))
            raise SystemExit(0)
        print(json.dumps({"snapshot_id": snap, "context_id": ctx.id, "sandbox_id": sb.id}))
    finally:
        sb.kill()  # the snapshot outlives its sandbox
"""

RESTORE_PROCESS = """
    import json, sys
    from pandastack import CodeContext, Sandbox

    snapshot_id, context_id = sys.argv[1], sys.argv[2]
    sb = Sandbox.create(snapshot_id=snapshot_id, ttl_seconds=600)
    try:
        listed = [c.id for c in sb.list_code_contexts()]
        ctx = CodeContext.connect(sb, context_id)
        ex = ctx.run_code("import os\\nprint(secret + 1, half, data['k'][-1], os.getcwd())")
        print(json.dumps({
            "sandbox_id": sb.id,
            "template": sb.template,
            "state": sb.state,
            "contexts": listed,
            "stdout": ex.stdout,
            "error": str(ex.error) if ex.error else None,
            "file": sb.files.read_text("notes.txt"),
        }))
    finally:
        sb.kill()
"""


@pytest.mark.code_interpreter
def test_snapshot_in_one_process_restore_in_another(server):
    require_code_interpreter(server)
    first = run_process(SNAPSHOT_PROCESS)
    if "missing" in first:
        no_endpoint(NotFoundError(first["missing"], code="not_found", status=404))
    assert first["snapshot_id"].startswith("snap_")
    # the original sandbox is gone: the restore depends on the snapshot only
    with pytest.raises(NotFoundError):
        Sandbox.connect(first["sandbox_id"])

    second = run_process(RESTORE_PROCESS, first["snapshot_id"], first["context_id"])
    assert second["error"] is None, second["error"]
    assert second["stdout"] == "42 1/2 3 /home/user/work\n"
    assert second["file"] == "kept across processes"
    assert first["context_id"] in second["contexts"]
    assert second["template"] == CODE_TEMPLATE and second["state"] == "running"
    assert second["sandbox_id"] != first["sandbox_id"]

    info = Sandbox.get_snapshot(first["snapshot_id"])
    assert info.sandbox_id == first["sandbox_id"] and info.metadata == {"suite": "sdk-python"}
    Sandbox.delete_snapshot(first["snapshot_id"])


def test_snapshot_record_list_restore_delete(sandbox):
    tag = uuid.uuid4().hex
    sandbox.files.write("state.txt", "before snapshot")
    info = snapshot(sandbox, metadata={"tag": tag})
    assert isinstance(info, SnapshotInfo)
    assert info.id.startswith("snap_") and info.sandbox_id == sandbox.id
    assert info.template == "base" and info.size_bytes > 0 and info.metadata == {"tag": tag}
    assert info.created_at is not None
    # the policy its restores get: the sandbox's (None without networking)
    assert info.network == sandbox.network

    # the sandbox keeps running and changing; the snapshot does not
    sandbox.files.write("state.txt", "after snapshot")
    assert [s.id for s in Sandbox.list_snapshots(metadata={"tag": tag})] == [info.id]
    assert Sandbox.get_snapshot(info.id).id == info.id
    # snapshot() is the same, returning the id only
    sid2 = sandbox.snapshot()
    assert sid2.startswith("snap_") and sid2 != info.id

    with Sandbox.create(snapshot_id=info.id, ttl_seconds=120, metadata={"restored": tag}) as restored:
        assert restored.id != sandbox.id and restored.template == "base"
        assert restored.metadata == {"restored": tag}
        assert restored.files.read_text("state.txt") == "before snapshot"
        assert restored.exec("echo $PANDASTACK_SANDBOX_ID").stdout.strip() == restored.id
    assert sandbox.files.read_text("state.txt") == "after snapshot"

    with pytest.raises(InvalidRequestError):
        Sandbox.create(snapshot_id=info.id, env={"X": "1"})
    Sandbox.delete_snapshot(info.id)
    Sandbox.delete_snapshot(sid2)
    with pytest.raises(NotFoundError):
        Sandbox.get_snapshot(info.id)
    with pytest.raises(NotFoundError):
        Sandbox.create(snapshot_id=info.id)


@pytest.mark.code_interpreter
def test_fork_gives_independent_copies(code_sandbox):
    ctx = code_sandbox.create_code_context()
    ctx.run_code("secret = 41")
    try:
        kids = code_sandbox.fork(2)
    except NotFoundError as e:
        if e.message.startswith(NO_ROUTE):
            no_endpoint(e)
        raise
    try:
        assert len(kids) == 2 and all(isinstance(k, Sandbox) for k in kids)
        assert len({k.id for k in kids} | {code_sandbox.id}) == 3
        for i, k in enumerate(kids):
            assert k.state == "running"
            assert ctx.id in [c.id for c in k.list_code_contexts()]
            kc = CodeContext.connect(k, ctx.id)
            assert kc.run_code("secret").text == "41"
            kc.run_code(f"secret = {100 + i}")
        for i, k in enumerate(kids):
            assert CodeContext.connect(k, ctx.id).run_code("secret").text == str(100 + i)
        assert ctx.run_code("secret").text == "41"
    finally:
        for k in kids:
            k.kill()
        ctx.close()


def test_pause_resume(sandbox):
    sandbox.files.write("kept.txt", "through a pause")
    try:
        sandbox.pause()
    except NotFoundError as e:
        if e.message.startswith(NO_ROUTE):
            no_endpoint(e)
        raise
    assert sandbox.state == "paused"
    assert Sandbox.connect(sandbox.id).state == "paused"
    assert sandbox.id in [s.id for s in Sandbox.list()]
    with pytest.raises(ConflictError) as ei:
        sandbox.exec("true")
    assert ei.value.code == "conflict" and "paused" in ei.value.message
    sandbox.resume()
    assert sandbox.state == "running"
    assert sandbox.files.read_text("kept.txt") == "through a pause"
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_paused_sandbox_forks_and_snapshots_without_waking(sandbox):
    sandbox.files.write("kept.txt", "before the pause")
    try:
        sandbox.pause()
    except NotFoundError as e:
        if e.message.startswith(NO_ROUTE):
            no_endpoint(e)
        raise
    kids = sandbox.fork(1, ttl_seconds=60)
    try:
        assert kids[0].state == "running"
        assert kids[0].files.read_text("kept.txt") == "before the pause"
    finally:
        kids[0].kill()
    assert sandbox.refresh().state == "paused"
    sid = sandbox.snapshot()
    try:
        assert sandbox.refresh().state == "paused"
        with Sandbox.create(snapshot_id=sid, ttl_seconds=60) as restored:
            assert restored.files.read_text("kept.txt") == "before the pause"
    finally:
        Sandbox.delete_snapshot(sid)
    sandbox.resume()
    assert sandbox.files.read_text("kept.txt") == "before the pause"


def test_auto_resume(server):
    with Sandbox.create(ttl_seconds=120, auto_resume=True) as sb:
        assert sb.auto_resume is True
        sb.exec("echo 7 > n.txt")
        try:
            sb.pause()
        except NotFoundError as e:
            if e.message.startswith(NO_ROUTE):
                no_endpoint(e)
            raise
        assert sb.state == "paused"
        # any request brings it back
        assert sb.exec("cat n.txt").stdout == "7\n"
        assert sb.refresh().state == "running"


@pytest.mark.anyio
async def test_async_snapshot_fork_pause(server):
    async with await AsyncSandbox.create(ttl_seconds=120) as sb:
        await sb.files.write("a.txt", "async snapshot")
        try:
            sid = await sb.snapshot()
        except NotFoundError as e:
            if e.message.startswith(NO_ROUTE):
                no_endpoint(e)
            raise
        assert sid.startswith("snap_")
        assert sid in [s.id for s in await AsyncSandbox.list_snapshots()]
        async with await AsyncSandbox.create(snapshot_id=sid, ttl_seconds=120) as restored:
            assert await restored.files.read_text("a.txt") == "async snapshot"
        kids = await sb.fork(1, ttl_seconds=60, metadata={"kid": "1"})
        assert len(kids) == 1 and kids[0].metadata == {"kid": "1"}
        assert await kids[0].files.read_text("a.txt") == "async snapshot"
        await kids[0].kill()
        await sb.pause()
        assert sb.state == "paused"
        await sb.resume()
        assert sb.state == "running"
        assert (await sb.exec("cat a.txt")).stdout == "async snapshot"
        await AsyncSandbox.delete_snapshot(sid)
        with pytest.raises(NotFoundError):
            await AsyncSandbox.get_snapshot(sid)
