"""Fixtures of the browser tests: a real `pandastack serve` (the built
binary, a fresh data dir, a free loopback port), the data-analyst app
against it, and headless Chromium from the system's packages driven by
Playwright (no browser download: PANDASTACK_CHROMIUM or /usr/bin/chromium).

A failing test saves a screenshot to the artifacts folder, which the
session prints (PANDASTACK_BROWSER_ARTIFACTS, default a temp dir, removed
after a run that passes); a run that passes copies the README's
screenshots to PANDASTACK_README_IMAGES when it is set (docs/img).
Prerequisites missing skip the tests on a developer machine and fail them
under CI=true.
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
from pathlib import Path
from typing import Iterator

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").lower() == "true"
ARTIFACTS = Path(os.environ.get("PANDASTACK_BROWSER_ARTIFACTS") or tempfile.mkdtemp(prefix="pandastack-browser-"))


def missing(reason: str) -> None:
    if CI:
        pytest.fail(f"{reason} (CI=true: a missing prerequisite fails)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}", pytrace=False)
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{url} did not answer in time:\n{log.read_text(errors='replace')[-4000:]}", pytrace=False)
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# The screenshots the README shows; with PANDASTACK_README_IMAGES=docs/img a
# run that passes refreshes them there.
README_IMAGES = ("console.png", "console-snapshots.png", "data-analyst.png")


def pytest_sessionstart(session: pytest.Session) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser test screenshots go to {ARTIFACTS}", file=sys.stderr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus != 0:
        return
    dest = os.environ.get("PANDASTACK_README_IMAGES")
    if dest:
        for name in README_IMAGES:
            if (ARTIFACTS / name).exists():
                shutil.copyfile(ARTIFACTS / name, Path(dest) / name)
                print(f"\n{Path(dest) / name} refreshed", file=sys.stderr)
    if not os.environ.get("PANDASTACK_BROWSER_ARTIFACTS"):
        # Our own temp dir: nothing in it is wanted after a run that passes.
        shutil.rmtree(ARTIFACTS, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        page = item.funcargs.get("page")
        if page is not None:
            path = ARTIFACTS / f"FAILED-{item.name}.png"
            try:
                page.screenshot(path=str(path), full_page=True)
                report.sections.append(("screenshot", f"saved to {path}"))
                print(f"\nscreenshot of the failure: {path}", file=sys.stderr)
            except Exception as e:  # the page may be gone
                print(f"\ncould not take a screenshot: {e}", file=sys.stderr)


class Serve:
    def __init__(self, url: str, key: str, log: Path) -> None:
        self.url, self.key, self.log = url, key, log

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=120)


@pytest.fixture(scope="session")
def serve() -> Iterator[Serve]:
    binary = Path(os.environ.get("PANDASTACK_BIN") or REPO / "bin" / "pandastack")
    if not binary.exists():
        missing(f"no pandastack binary at {binary}: run ./scripts/setup.sh")
    if os.geteuid() != 0:
        missing("pandastack serve needs root (gVisor): run the tests as root")
    data = Path(tempfile.mkdtemp(prefix="pandastack-browser-data-"))
    port = free_port()
    env = dict(os.environ, PANDASTACK_LISTEN=f"127.0.0.1:{port}", PANDASTACK_DATA_DIR=str(data),
               PANDASTACK_KILL_ON_EXIT="1", PANDASTACK_BUILD_ON_START="base,code-interpreter",
               PANDASTACK_CACHE_DIR=os.environ.get("PANDASTACK_CACHE_DIR", "/var/cache/pandastack"))
    for k in ("PANDASTACK_API", "PANDASTACK_API_KEY"):
        env.pop(k, None)
    log = data.with_name(data.name + ".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log, 60 * 60)
        srv = Serve(f"http://127.0.0.1:{port}", (data / "api-key").read_text().strip(), log)
        yield srv
        with srv.api() as h:
            for sb in h.get("/v1/sandboxes").json()["sandboxes"]:
                h.delete(f"/v1/sandboxes/{sb['id']}")
    finally:
        stop(proc)
        shutil.rmtree(data, ignore_errors=True)
        log.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def analyst_app(serve: Serve) -> Iterator[str]:
    """The data-analyst example, started as its README says, on a free port."""
    port = free_port()
    env = dict(os.environ, PANDASTACK_API=serve.url, PANDASTACK_API_KEY=serve.key,
               DATA_ANALYST_LISTEN=f"127.0.0.1:{port}")
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env.pop(k, None)  # the scripted demo model: offline
    log = Path(tempfile.mkstemp(prefix="data-analyst-", suffix=".log")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "data-analyst" / "app.py")], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc, log, 120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        log.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed: scripts/test-browser.sh installs it")
    exe = os.environ.get("PANDASTACK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(exe).exists():
        missing("no chromium: apt-get install chromium (scripts/setup.sh does it)")
    from playwright.sync_api import expect

    # Sandboxes and kernels start in seconds, more on a busy machine: wait
    # for what the user would wait for rather than fail at 5 s.
    expect.set_options(timeout=120_000)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(120_000)
    yield pg
    ctx.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    return ARTIFACTS
