"""The synchronous Sandbox API against a real server: life cycle, exec,
files and typed errors."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from pandastack import (
    AuthenticationError,
    Client,
    CommandNotFoundError,
    ConflictError,
    ExecResult,
    FileEvent,
    FileInfo,
    InvalidRequestError,
    NotFoundError,
    PandaStackError,
    PermissionDeniedError,
    Sandbox,
)


def test_create_attributes_and_kill(server):
    tag = uuid.uuid4().hex
    before = datetime.now(timezone.utc)
    sb = Sandbox.create(ttl_seconds=120, metadata={"suite": "sdk-python", "tag": tag}, env={"GREETING": "hi"})
    try:
        assert sb.id.startswith("sbx_") and len(sb.id) == 20
        assert sb.template == "base"
        assert sb.state == "running"
        assert sb.metadata == {"suite": "sdk-python", "tag": tag}
        assert sb.expires_at is not None
        # TTL 120 s from creation, give or take the boot.
        assert before + timedelta(seconds=100) < sb.expires_at < before + timedelta(seconds=200)
        assert sb.cpu >= 1 and sb.memory_mb >= 64
        # The sandbox env reaches commands.
        assert sb.exec("echo $GREETING").stdout == "hi\n"
    finally:
        sb.kill()
    assert sb.state == "stopped"
    with pytest.raises(NotFoundError) as ei:
        Sandbox.connect(sb.id)
    assert ei.value.code == "not_found" and ei.value.status == 404
    sb.kill()  # killing twice is fine


def test_context_manager_kills(server):
    with Sandbox.create(ttl_seconds=120) as sb:
        sid = sb.id
        assert sb.is_running()
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid)


def test_connect_and_list_by_metadata(sandbox):
    tag = uuid.uuid4().hex
    other = Sandbox.create(ttl_seconds=120, metadata={"tag": tag, "role": "worker"})
    try:
        again = Sandbox.connect(other.id)
        assert again.id == other.id and again.metadata == {"tag": tag, "role": "worker"}
        assert again == other

        found = Sandbox.list(metadata={"tag": tag})
        assert [s.id for s in found] == [other.id]
        assert Sandbox.list(metadata={"tag": tag, "role": "worker"})[0].id == other.id
        assert Sandbox.list(metadata={"tag": tag, "role": "boss"}) == []
        all_ids = {s.id for s in Sandbox.list()}
        assert {other.id, sandbox.id} <= all_ids
    finally:
        other.kill()
    assert Sandbox.list(metadata={"tag": tag}) == []


def test_set_ttl(sandbox):
    old = sandbox.expires_at
    sandbox.set_ttl(3000)
    assert sandbox.expires_at > old + timedelta(seconds=2000)
    # The store keeps milliseconds; PATCH answers with the full precision.
    assert abs(Sandbox.connect(sandbox.id).expires_at - sandbox.expires_at) < timedelta(milliseconds=5)
    sandbox.set_ttl(60)
    assert sandbox.expires_at < datetime.now(timezone.utc) + timedelta(seconds=90)


def test_idle_timeout(sandbox):
    assert sandbox.idle_timeout_seconds == 300  # the server's default
    assert sandbox.pause_reason is None
    sandbox.set_idle_timeout(0)
    assert sandbox.idle_timeout_seconds == 0
    assert Sandbox.connect(sandbox.id).idle_timeout_seconds == 0
    other = Sandbox.create(idle_timeout_seconds=45)
    try:
        assert other.idle_timeout_seconds == 45
    finally:
        other.kill()


def test_refresh(sandbox):
    assert sandbox.refresh() is sandbox
    assert sandbox.state == "running"


def test_stats(sandbox):
    sandbox.exec("python3 -c 'sum(range(3_000_000))'")
    st = sandbox.stats()
    assert st.memory_limit_bytes == sandbox.memory_mb << 20 and st.cpu_limit == sandbox.cpu
    assert 0 < st.memory_bytes < st.memory_limit_bytes and 0 < st.memory_used_fraction < 1
    assert st.cpu_seconds > 0 and st.sampled_at is not None
    # Its disk, as df shows it inside: a file written shows in its use.
    assert st.disk_limit_bytes and 0 < st.disk_bytes < st.disk_limit_bytes
    sandbox.exec("head -c 20000000 /dev/urandom > /home/user/disk-fill")
    try:
        after = sandbox.stats()
        assert after.disk_limit_bytes == st.disk_limit_bytes
        assert after.disk_bytes >= st.disk_bytes + 19_000_000, (st, after)
        assert 0 < after.disk_used_fraction < 1
    finally:
        sandbox.exec("rm -f /home/user/disk-fill")


# ----- exec -------------------------------------------------------------


def test_exec_shell_string(sandbox):
    r = sandbox.exec("echo hello; echo oops >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hello\n", "oops\n", 3, False)
    assert r.duration_ms >= 0
    assert not r.ok


def test_exec_argv_env_cwd_stdin(sandbox):
    r = sandbox.exec(["python3", "-c", "import os,sys; print(os.getcwd(), os.environ['X'], sys.stdin.read())"],
                     env={"X": "forty two"}, cwd="/tmp", stdin="from stdin")
    assert r.ok, r
    assert r.stdout == "/tmp forty two from stdin\n"
    # argv is not parsed by a shell
    assert sandbox.exec(["echo", "$HOME", "a;b"]).stdout == "$HOME a;b\n"
    assert sandbox.exec("whoami").stdout.strip() == "user"


def test_exec_timeout(sandbox):
    start = time.monotonic()
    r = sandbox.exec("echo started; sleep 30; echo never", timeout=1.5)
    elapsed = time.monotonic() - start
    assert r.timed_out is True
    assert r.stdout == "started\n"
    assert r.exit_code != 0
    assert elapsed < 15


def test_exec_streams_in_order(sandbox):
    events = []
    start = time.monotonic()

    def out(chunk: str) -> None:
        events.append(("out", chunk, time.monotonic() - start))

    def err(chunk: str) -> None:
        events.append(("err", chunk, time.monotonic() - start))

    r = sandbox.exec("for i in 1 2 3 4; do echo line$i; sleep 0.4; done; echo bye >&2",
                     on_stdout=out, on_stderr=err)
    finished = time.monotonic() - start
    assert r.exit_code == 0
    assert r.stdout == "line1\nline2\nline3\nline4\n" and r.stderr == "bye\n"
    outs = "".join(c for k, c, _ in events if k == "out")
    assert outs == r.stdout
    assert [c for k, c, _ in events if k == "err"] == ["bye\n"]
    # Chunks arrived live, not all at the end: the first one well before the last.
    first_out = next(t for k, _, t in events if k == "out")
    assert first_out < finished - 0.8, (first_out, finished, events)


def test_exec_missing_program(sandbox):
    with pytest.raises(CommandNotFoundError) as ei:
        sandbox.exec(["no-such-program-xyz"])
    e = ei.value
    assert isinstance(e, InvalidRequestError)
    assert e.code == "command_not_found" and e.status == 400 and "no-such-program-xyz" in e.message
    # a shell reports it as exit status 127 instead
    assert sandbox.exec("no-such-program-xyz").exit_code == 127


# ----- files -------------------------------------------------------------


def test_files_write_read_text_and_bytes(sandbox):
    info = sandbox.files.write("notes/hello.txt", "héllo\n")
    assert isinstance(info, FileInfo)
    assert info.path == "/home/user/notes/hello.txt" and info.type == "file" and info.size == len("héllo\n".encode())
    assert sandbox.files.read("/home/user/notes/hello.txt") == "héllo\n".encode()
    assert sandbox.files.read_text("notes/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 3
    sandbox.files.write("/tmp/blob.bin", blob)
    assert sandbox.files.read("/tmp/blob.bin") == blob
    # visible to commands in the sandbox
    assert sandbox.exec("cat notes/hello.txt").stdout == "héllo\n"
    # a binary file object is streamed
    import io

    sandbox.files.write("from-io.bin", io.BytesIO(blob * 2000))
    assert sandbox.files.read("from-io.bin") == blob * 2000


def test_files_upload_download_sha256(sandbox, tmp_path):
    src = tmp_path / "big.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for i in range(24):  # 24 MiB, several chunks
            chunk = os.urandom(1 << 20)
            h.update(chunk)
            f.write(chunk)
    digest = h.hexdigest()
    info = sandbox.files.upload(src, "data/big.bin")
    assert info.size == 24 << 20
    # the sandbox sees the same bytes
    assert sandbox.exec("sha256sum data/big.bin").stdout.split()[0] == digest
    dst = tmp_path / "back.bin"
    n = sandbox.files.download("data/big.bin", dst)
    assert n == 24 << 20
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    assert not (tmp_path / "back.bin.part").exists()


def test_download_missing_leaves_nothing(sandbox, tmp_path):
    dst = tmp_path / "nope.bin"
    with pytest.raises(NotFoundError):
        sandbox.files.download("does/not/exist", dst)
    assert list(tmp_path.iterdir()) == []


def test_files_list_stat_mkdir_remove(sandbox):
    d = sandbox.files.mkdir("proj/src/pkg")
    assert d.type == "dir" and d.is_dir and d.path == "/home/user/proj/src/pkg"
    sandbox.files.write("proj/b.txt", b"bb")
    sandbox.files.write("proj/a.txt", b"a")
    names = [(f.name, f.type) for f in sandbox.files.list("proj")]
    assert names == [("a.txt", "file"), ("b.txt", "file"), ("src", "dir")]
    st = sandbox.files.stat("proj/b.txt")
    assert st.size == 2 and st.mode == "0644" and st.mod_time is not None
    assert sandbox.files.exists("proj/a.txt") and not sandbox.files.exists("proj/zzz")

    moved = sandbox.files.rename("proj/a.txt", "proj/old/a.txt")
    assert moved.path == "/home/user/proj/old/a.txt" and moved.size == 1
    assert not sandbox.files.exists("proj/a.txt")
    with pytest.raises(ConflictError):
        sandbox.files.rename("proj/b.txt", "proj/old/a.txt")
    assert sandbox.files.rename("proj/b.txt", "proj/old/a.txt", overwrite=True).size == 2
    assert sandbox.files.read("proj/old/a.txt") == b"bb"
    sandbox.files.write("proj/a.txt", b"a")

    sandbox.files.remove("proj/a.txt")
    assert not sandbox.files.exists("proj/a.txt")
    with pytest.raises(ConflictError) as ei:
        sandbox.files.remove("proj")
    assert ei.value.code == "conflict" and ei.value.status == 409
    sandbox.files.remove("proj", recursive=True)
    assert not sandbox.files.exists("proj")
    with pytest.raises(NotFoundError):
        sandbox.files.stat("proj")


def test_files_the_user_may_not_touch(sandbox):
    # File operations act as the sandbox user: root's files are refused with
    # permission_denied, which is also Python's own PermissionError.
    with pytest.raises(PermissionDeniedError) as ei:
        sandbox.files.read("/etc/shadow")
    assert ei.value.code == "permission_denied" and ei.value.status == 403
    with pytest.raises(PermissionError):
        sandbox.files.write("/etc/pandastack-probe.txt", "x")
    assert not sandbox.files.exists("/etc/pandastack-probe.txt")


def _events_until(handle, want, timeout=20.0):
    """Poll handle until every (type, name) in want has come; return all."""
    seen = []
    deadline = time.monotonic() + timeout
    left = set(want)
    while left and time.monotonic() < deadline:
        for ev in handle.get_new_events():
            seen.append(ev)
            left.discard((ev.type, ev.name))
        time.sleep(0.05)
    assert not left, f"still waiting for {left}; saw {[(e.type, e.name) for e in seen]}"
    return seen


def test_files_watch_dir(sandbox):
    sandbox.files.mkdir("watched")
    called = []
    with sandbox.files.watch_dir("watched", on_event=called.append, recursive=True) as w:
        assert w.running
        sandbox.exec("cd watched && echo one > a.txt && mkdir -p sub/deep && echo two > sub/deep/b.txt && mv a.txt c.txt && rm c.txt")
        seen = _events_until(w, {("create", "a.txt"), ("write", "a.txt"), ("create", "sub"), ("create", "sub/deep"),
                                 ("create", "sub/deep/b.txt"), ("rename", "a.txt"), ("create", "c.txt"), ("remove", "c.txt")})
        ev = next(e for e in seen if e.name == "sub")
        assert isinstance(ev, FileEvent) and ev.is_dir and ev.path == "/home/user/watched/sub"
        assert [(e.type, e.name) for e in called[: len(seen)]] == [(e.type, e.name) for e in seen]
    assert not w.running
    with pytest.raises(NotFoundError):
        sandbox.files.watch_dir("not-there")
    sandbox.files.write("plain.txt", "x")
    with pytest.raises(InvalidRequestError):
        sandbox.files.watch_dir("plain.txt")


def test_files_watch_dir_ends_with_its_sandbox(server):
    sb = Sandbox.create(ttl_seconds=120)
    w = sb.files.watch_dir(".")
    sb.kill()
    deadline = time.monotonic() + 20
    while w.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not w.running
    with pytest.raises(PandaStackError):
        for _ in range(100):  # events of the kill's last moments, then its error
            w.get_new_events()


def test_create_with_a_disk_size(server):
    sb = Sandbox.create(ttl_seconds=120, disk_mb=128)
    try:
        assert sb.exec("df -m / | tail -1 | tr -s ' ' | cut -d' ' -f2").stdout.strip() == "128"
    finally:
        sb.kill()


def test_files_exists_of_a_gone_sandbox(server):
    sb = Sandbox.create(ttl_seconds=120)
    sb.files.write("f.txt", "x")
    assert sb.files.exists("f.txt") and not sb.files.exists("g.txt")
    sb.kill()
    with pytest.raises(NotFoundError):  # the sandbox is gone, not the file
        sb.files.exists("f.txt")


# ----- errors -------------------------------------------------------------


def test_errors_carry_server_code(server, sandbox):
    with pytest.raises(NotFoundError) as ei:
        Sandbox.connect("sbx_aaaaaaaaaaaaaaaa")
    assert (ei.value.code, ei.value.status) == ("not_found", 404)
    assert "sbx_aaaaaaaaaaaaaaaa" in ei.value.message

    with pytest.raises(InvalidRequestError) as ei2:
        Sandbox.create(ttl_seconds=10**9)
    assert (ei2.value.code, ei2.value.status) == ("invalid_request", 400)

    with pytest.raises(NotFoundError):
        Sandbox.create(template="no-such-template")

    with pytest.raises(InvalidRequestError):
        sandbox.exec("true", timeout=-1)

    bad = Client(api_key="pds_" + "x" * 32, api_url=server.url)
    with pytest.raises(AuthenticationError) as ei3:
        Sandbox.list(client=bad)
    assert (ei3.value.code, ei3.value.status) == ("unauthorized", 401)
    assert isinstance(ei3.value, PandaStackError)
    assert "unauthorized" in str(ei3.value) and "401" in str(ei3.value)


def test_explicit_client(server):
    c = Client(api_key=server.api_key, api_url=server.url)
    assert c.health()
    templates = {t.name: t for t in c.list_templates()}
    assert "base" in templates
    # Each says the disk its sandboxes get (the server's default 2048 MiB).
    assert [t.disk_mb for t in templates.values()] == [2048] * len(templates), templates
    with Sandbox.create(ttl_seconds=120, client=c) as sb:
        assert sb.client is c
        assert sb.exec("echo via explicit client").stdout == "via explicit client\n"
        assert Sandbox.connect(sb.id, client=c).id == sb.id


def test_list_reads_every_page(server, monkeypatch):
    """list() reads the server's list a page at a time (500 a page; 2
    here) and returns every match, oldest first."""
    import pandastack._base as base

    monkeypatch.setattr(base, "LIST_PAGE", 2)
    tag = uuid.uuid4().hex
    made = []
    try:
        for _ in range(3):
            made.append(Sandbox.create(ttl_seconds=120, metadata={"tag": tag}))
        assert [s.id for s in Sandbox.list(metadata={"tag": tag})] == [s.id for s in made]
        assert [s.id for s in Sandbox.list(metadata={"tag": tag}, state="all")] == [s.id for s in made]
    finally:
        for s in made:
            s.kill()
    assert Sandbox.list(metadata={"tag": tag}) == []


def test_list_by_state(sandbox):
    assert sandbox.id in [s.id for s in Sandbox.list(state="running")]
    assert sandbox.id in [s.id for s in Sandbox.list(state=["running", "stopped"])]
    assert sandbox.id in [s.id for s in Sandbox.list(state="all")]
    assert sandbox.id not in [s.id for s in Sandbox.list(state="stopped")]
    with pytest.raises(InvalidRequestError):
        Sandbox.list(state="bogus")


def test_kill_during_streamed_exec_raises(server):
    """A failure after a stream started arrives as an error event; the SDK
    raises it with the server's code instead of hanging or returning junk."""
    import threading

    from pandastack import SandboxStoppedError

    sb = Sandbox.create(ttl_seconds=120)
    chunks, out = [], {}

    def run():
        try:
            out["result"] = sb.exec("echo start; sleep 30", on_stdout=chunks.append)
        except PandaStackError as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while not chunks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chunks == ["start\n"]
    sb.kill()
    t.join(30)
    assert not t.is_alive()
    err = out.get("error")
    assert isinstance(err, SandboxStoppedError), out
    assert err.code == "sandbox_stopped" and sb.id in err.message and "killed" in err.message


def test_client_side_timeout(server):
    import builtins

    import pandastack

    tag = uuid.uuid4().hex
    impatient = Client(api_key=server.api_key, api_url=server.url, timeout=0.02)
    with pytest.raises(pandastack.TimeoutError) as ei:
        Sandbox.create(ttl_seconds=60, metadata={"tag": tag}, client=impatient)
    assert ei.value.code == "client_timeout" and ei.value.status is None
    assert isinstance(ei.value, builtins.TimeoutError)
    # The server kills the sandbox of a create whose caller hung up (nobody
    # would learn its id): none is left running.
    start = time.monotonic()
    while time.monotonic() < start + 60:
        found = Sandbox.list(metadata={"tag": tag}, state="all")
        if found and all(sb.state == "stopped" for sb in found):
            return
        if not found and time.monotonic() > start + 10:
            return  # the create stopped before it made a record
        time.sleep(0.2)
    for sb in found:
        sb.kill()
    pytest.fail(f"the sandbox of the timed-out create is still alive: {found}")
