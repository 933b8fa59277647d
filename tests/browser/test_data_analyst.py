"""The data-analyst example app in a real browser, with the scripted demo
model (offline): upload a CSV, watch the steps stream in."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import httpx
from playwright.sync_api import Page, expect

from conftest import REPO, free_port, stop, wait_http


def sample_csv() -> bytes:
    rows = ["day,visitors,ad_spend,sales,temperature"]
    for d in range(120):
        spend = 100 + (d * 37) % 250
        visitors = int(800 + 3.1 * spend + 120 * math.sin(d / 6))
        rows.append(f"{d},{visitors},{spend},{round(visitors * 0.042 + 7 * math.cos(d), 2)},{round(12 + 9 * math.sin(d / 19), 1)}")
    return ("\n".join(rows) + "\n").encode()


def test_data_analyst_streams_steps(page: Page, analyst_app, artifacts) -> None:
    page.goto(analyst_app)
    page.set_input_files("#csv", {"name": "shop.csv", "mimeType": "text/csv", "buffer": sample_csv()})
    page.fill("#question", "What drives sales?")
    page.get_by_role("button", name="Analyse").click()

    # While the agent still works: two steps and a chart are on the page.
    steps = page.locator("article.step")
    expect(steps.nth(1)).to_be_visible()
    expect(page.locator("article.step img").first).to_be_visible()
    assert page.evaluate("document.body.dataset.run") == "running", "the steps arrived only at the end of the run"
    expect(page.locator("article.step table").first).to_contain_text("visitors")

    expect(page.locator("body[data-run=done]")).to_be_attached()
    expect(page.locator("#answer")).to_contain_text("strongest correlation")
    assert steps.count() >= 4
    assert page.locator("article.step[data-status=done]").count() == steps.count()
    page.screenshot(path=str(artifacts / "data-analyst.png"), full_page=True)


def read_events(app: str, run_id: str, on_event=None) -> list:
    """Every event of a run, read as a page does (server-sent events)."""
    events = []
    with httpx.stream("GET", f"{app}/api/runs/{run_id}/events", timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                ev = json.loads(line[len("data: "):])
                events.append(ev)
                if on_event:
                    on_event(ev)
    return events


def test_demo_handles_awkward_csvs_offline(analyst_app, serve) -> None:
    """The demo model's analysis of a CSV with no numeric column, in Latin-1,
    runs every step without an error (they failed, and the answer was a
    traceback), in a sandbox without internet access, as its prompt says."""
    csv = "ville,région\nNîmes,Occitanie\nAlès,Occitanie\nCaen,Normandie\n".encode("latin-1")
    run_id = httpx.post(f"{analyst_app}/api/runs", params={"question": "Which region?"}, content=csv).json()["id"]
    networks = []

    def check_network(ev):
        if ev["type"] == "sandbox":
            with serve.api() as api:
                networks.append(api.get(f"/v1/sandboxes/{ev['sandbox_id']}").json().get("network"))

    events = read_events(analyst_app, run_id, check_network)
    steps = [ev for ev in events if ev["type"] == "step" and ev.get("status") != "running"]
    assert len(steps) >= 4 and all(ev["status"] == "done" for ev in steps), [ev.get("stdout") or ev for ev in steps]
    assert "read as Windows-1252" in steps[0].get("stdout", "")
    answer = [ev for ev in events if ev["type"] == "answer"]
    assert answer and "Traceback" not in answer[0]["answer"], events[-1]
    assert networks and networks[0]["allow_internet_access"] is False, networks


def test_demo_stops_on_an_unreadable_upload(analyst_app) -> None:
    """Bytes that are no CSV end the demo's analysis after its first step,
    saying why (it went on with three more failing steps, then said
    "analysis done")."""
    run_id = httpx.post(f"{analyst_app}/api/runs", content=bytes(range(256)) * 12).json()["id"]
    events = read_events(analyst_app, run_id)
    steps = [ev for ev in events if ev["type"] == "step" and ev.get("status") != "running"]
    answer = [ev["answer"] for ev in events if ev["type"] == "answer"]
    assert len(steps) == 1 and answer and answer[0].startswith("Demo analysis stopped"), events


def test_stopping_the_app_kills_the_runs_sandboxes(serve, tmp_path) -> None:
    """An app stopped in the middle of a run kills that run's sandbox (its
    thread died with the process, and the sandbox lived on until its TTL),
    and a run past DATA_ANALYST_MAX_RUNNING is refused, not started."""
    port = free_port()
    env = dict(os.environ, PANDASTACK_API=serve.url, PANDASTACK_API_KEY=serve.key,
               DATA_ANALYST_LISTEN=f"127.0.0.1:{port}", DATA_ANALYST_DEMO_PACE="30", DATA_ANALYST_MAX_RUNNING="1")
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env.pop(k, None)
    log = tmp_path / "app.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "examples" / "data-analyst" / "app.py")], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/", proc, log, 120)
        run_id = httpx.post(f"{url}/api/runs", content=sample_csv()).json()["id"]
        second = httpx.post(f"{url}/api/runs", content=sample_csv())
        assert second.status_code == 429 and "1 analyses are running" in second.json()["error"], second.text
        sandbox_id = None
        # As a page does, the run's events stay open while the app stops.
        with httpx.stream("GET", f"{url}/api/runs/{run_id}/events", timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and json.loads(line[5:])["type"] == "sandbox":
                    sandbox_id = json.loads(line[5:])["sandbox_id"]
                    break
            assert sandbox_id
            stop(proc)
    finally:
        stop(proc)
    # (uvicorn ends a SIGTERM's shutdown by raising the signal again: -15.)
    with serve.api() as api:
        got = api.get(f"/v1/sandboxes/{sandbox_id}")
    assert got.status_code == 404 or got.json().get("state") == "stopped", (got.text, log.read_text(errors="replace")[-4000:])
