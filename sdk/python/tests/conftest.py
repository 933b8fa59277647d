"""Fixtures of the SDK's end-to-end tests: one real `pandastack serve` per
test session, started from the built binary on a free loopback port with a
fresh data directory. No mocks: every test drives real gVisor sandboxes.

Prerequisites (the binary, root, the code-interpreter template, the snapshot
endpoints) skip the tests that need them on a developer machine, with the
fix in the message; under CI=true they fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

import httpx
import pytest

import pandastack
from pandastack import Client, Sandbox

REPO = Path(__file__).resolve().parents[3]
CI = os.environ.get("CI", "").lower() == "true"
CODE_TEMPLATE = "code-interpreter"

# How long serve may take to answer /healthz: building the code-interpreter
# template on a first start takes many minutes (then it is cached).
START_TIMEOUT = 5 * 60
BUILD_START_TIMEOUT = 60 * 60


def missing(reason: str) -> None:
    """A prerequisite is missing: skip here, fail under CI=true."""
    if CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails)", pytrace=False)
    pytest.skip(reason)


@dataclass
class Server:
    url: str
    api_key: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen
    templates_known: List[str]
    building: Optional[str]

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def client(self) -> Client:
        return Client(api_key=self.api_key, api_url=self.url)


def _binary() -> Optional[Path]:
    env = os.environ.get("PANDASTACK_BIN")
    if env:
        return Path(env)
    p = REPO / "bin" / "pandastack"
    return p if p.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _known_templates(binary: Path, env: dict) -> List[str]:
    out = subprocess.run([str(binary), "template", "ls"], env=env, capture_output=True, text=True, timeout=60)
    names = []
    for line in out.stdout.splitlines()[1:]:
        if line.strip():
            names.append(line.split()[0])
    return names


def _kill_all(url: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as h:
            for sb in h.get("/v1/sandboxes", params={"state": "all"}).json().get("sandboxes", []):
                h.delete(f"/v1/sandboxes/{sb['id']}")
    except Exception as e:  # teardown must go on to stop the server
        print(f"warning: could not kill the sandboxes left: {e}", file=sys.stderr)


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The running server; PANDASTACK_API and PANDASTACK_API_KEY point at it
    for the whole session (subprocesses inherit them)."""
    binary = _binary()
    if binary is None or not binary.exists():
        where = binary or REPO / "bin" / "pandastack"
        missing(f"no pandastack binary at {where} ($PANDASTACK_BIN, else bin/pandastack): run `./scripts/setup.sh`")
    if os.geteuid() != 0:
        missing("`pandastack serve` needs root (gVisor): run the tests as root, e.g. `scripts/test-python.sh`")
    assert binary is not None

    data_dir = Path(tempfile.mkdtemp(prefix="pandastack-sdk-test-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env.update(
        PANDASTACK_LISTEN=f"127.0.0.1:{port}",
        PANDASTACK_DATA_DIR=str(data_dir),
        PANDASTACK_KILL_ON_EXIT="1",
        PANDASTACK_CACHE_DIR=os.environ.get("PANDASTACK_CACHE_DIR", "/var/cache/pandastack"),
        PANDASTACK_LOG_LEVEL="debug",
    )
    for k in ("PANDASTACK_API", "PANDASTACK_API_KEY", "PANDASTACK_BUILD_ON_START"):
        env.pop(k, None)
    known = _known_templates(binary, env)
    needs_code = any(item.get_closest_marker("code_interpreter") for item in request.session.items)
    building = None
    if needs_code and CODE_TEMPLATE in known:
        # The setting replaces serve's default ("base"), which the other
        # tests need: keep it in the list.
        env["PANDASTACK_BUILD_ON_START"] = f"base,{CODE_TEMPLATE}"
        building = CODE_TEMPLATE

    log_path = data_dir.with_name(data_dir.name + ".log")
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(binary), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv = Server(url=url, api_key="", data_dir=data_dir, log_path=log_path, proc=proc, templates_known=known, building=building)

    deadline = time.monotonic() + (BUILD_START_TIMEOUT if building else START_TIMEOUT)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pandastack serve exited with {proc.returncode}:\n{srv.log_tail()}", pytrace=False)
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"pandastack serve did not answer /healthz in time:\n{srv.log_tail()}", pytrace=False)
            time.sleep(0.2)
        srv.api_key = (data_dir / "api-key").read_text().strip()
        saved = {k: os.environ.get(k) for k in ("PANDASTACK_API", "PANDASTACK_API_KEY")}
        os.environ["PANDASTACK_API"] = url
        os.environ["PANDASTACK_API_KEY"] = srv.api_key
        yield srv
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    finally:
        if srv.api_key:
            _kill_all(url, srv.api_key)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)
        if not os.environ.get("PANDASTACK_KEEP_LOG"):
            log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def client(server: Server) -> Client:
    return server.client()


@pytest.fixture
def sandbox(server: Server) -> Iterator[Sandbox]:
    """A fresh base sandbox, killed after the test."""
    try:
        sb = Sandbox.create(ttl_seconds=600, metadata={"suite": "sdk-python"})
    except pandastack.PandaStackError as e:
        pytest.fail(f"create sandbox: {e!r}\nserver log:\n{server.log_tail()}", pytrace=False)
    yield sb
    sb.kill()


def require_code_interpreter(server: Server) -> None:
    if CODE_TEMPLATE not in server.templates_known:
        missing(
            f"this pandastack binary knows no {CODE_TEMPLATE!r} template (templates: {server.templates_known}); "
            "rebuild it with `./scripts/setup.sh` once templates/code-interpreter.yaml exists"
        )


@pytest.fixture(scope="module")
def code_sandbox(server: Server) -> Iterator[Sandbox]:
    """A code-interpreter sandbox shared by a test module, killed after it."""
    require_code_interpreter(server)
    try:
        sb = Sandbox.create(template=CODE_TEMPLATE, ttl_seconds=1800, metadata={"suite": "sdk-python-code"})
    except pandastack.PandaStackError as e:
        pytest.fail(f"create {CODE_TEMPLATE} sandbox: {e!r}\nserver log:\n{server.log_tail()}", pytrace=False)
    yield sb
    sb.kill()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
