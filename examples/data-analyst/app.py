"""The data-analyst web app: upload a CSV, ask a question, and watch a
smolagents agent explore it in a PandaStack sandbox, each step (code,
output, charts, tables) streamed to the page with server-sent events.

A plain ASGI app (no web framework), served by uvicorn:

    PANDASTACK_API_KEY=$(cat /var/lib/pandastack/api-key) python examples/data-analyst/app.py

then open http://127.0.0.1:8090/. Settings: PANDASTACK_API (default
http://localhost:8080), DATA_ANALYST_LISTEN (127.0.0.1:8090), and for a
real model OPENAI_BASE_URL / OPENAI_API_KEY / DATA_ANALYST_MODEL.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, Optional, Tuple
from urllib.parse import parse_qs

from analyst import analyse, kill_live_sandboxes

STATIC = Path(__file__).resolve().parent / "static"
MAX_CSV = 50 << 20
MAX_RUNS = 100
# Analyses at once, each in a sandbox of its own: more are refused (429)
# until one ends, so a burst of uploads cannot start sandboxes without end.
MAX_RUNNING = int(os.environ.get("DATA_ANALYST_MAX_RUNNING", "4"))
running = threading.BoundedSemaphore(MAX_RUNNING)


class Run:
    """One analysis: its events, kept for every listener (a page may
    reconnect), and the thread that runs it. Listeners are woken on their
    own event loop; none holds a thread while it waits (with a thread each,
    six open pages used up the default pool and stalled every other page)."""

    def __init__(self) -> None:
        self.events: list = []
        self.lock = threading.Lock()
        self.done = False
        self.listeners: set = set()

    def emit(self, ev: Dict[str, Any]) -> None:
        with self.lock:
            self.events.append(ev)
            if ev["type"] in ("answer", "failed"):
                self.done = True
            listeners = list(self.listeners)
        for wake in listeners:
            wake()

    def since(self, seen: int) -> Tuple[list, bool]:
        """The events after the first ``seen``, and whether the run ended."""
        with self.lock:
            return self.events[seen:], self.done


runs: Dict[str, Run] = {}


def start_run(csv: bytes, question: str) -> Optional[str]:
    """Start an analysis in the background; None when MAX_RUNNING are
    running already."""
    if not running.acquire(blocking=False):
        return None
    rid = uuid.uuid4().hex[:12]
    run = Run()
    runs[rid] = run
    while len(runs) > MAX_RUNS:
        runs.pop(next(iter(runs)))

    def work() -> None:
        try:
            answer = analyse(csv, question, run.emit)
            run.emit({"type": "answer", "answer": answer})
        except Exception as e:  # reported to the page, not lost in a log
            run.emit({"type": "failed", "error": f"{type(e).__name__}: {e}"})
        finally:
            running.release()

    threading.Thread(target=work, name=f"run-{rid}", daemon=True).start()
    return rid


async def send_json(send, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


async def read_body(receive, limit: int) -> Optional[bytes]:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


async def events(receive, send, run: Run) -> None:
    """Server-sent events: every event of the run so far, then each new one
    as it comes, until the run ends or the page goes away."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()

    def wake() -> None:  # from the run's thread
        try:
            loop.call_soon_threadsafe(woken.set)
        except RuntimeError:
            pass  # the server is shutting down: its loop is closed

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    left = asyncio.ensure_future(gone())
    with run.lock:
        run.listeners.add(wake)
    seen = 0
    try:
        while not left.done():
            woken.clear()
            new, done = run.since(seen)
            if new:
                seen += len(new)
                body = b"".join(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode() for ev in new)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                continue
            if done:
                break
            waiter = asyncio.ensure_future(woken.wait())
            finished, _ = await asyncio.wait({waiter, left}, timeout=15.0, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not finished:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
        if not left.done():
            await send({"type": "http.response.body", "body": b""})
    finally:
        with run.lock:
            run.listeners.discard(wake)
        left.cancel()


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                # The runs' threads end with the process, before they kill
                # their sandboxes: killed here, or they would live on
                # until their TTL.
                await asyncio.to_thread(kill_live_sandboxes)
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, method = scope["path"], scope["method"]
    if method == "GET" and path in ("/", "/app.js", "/app.css"):
        name = "index.html" if path == "/" else path[1:]
        ctype = {"html": b"text/html; charset=utf-8", "js": b"text/javascript", "css": b"text/css"}[name.rsplit(".", 1)[1]]
        data = (STATIC / name).read_bytes()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": data})
        return
    if method == "POST" and path == "/api/runs":
        q = parse_qs(scope.get("query_string", b"").decode())
        csv = await read_body(receive, MAX_CSV)
        if not csv:
            await send_json(send, 400, {"error": f"send the CSV as the request body (at most {MAX_CSV >> 20} MiB)"})
            return
        rid = start_run(csv, q.get("question", [""])[0])
        if rid is None:
            await send_json(send, 429, {"error": f"{MAX_RUNNING} analyses are running; try again when one has ended"})
            return
        await send_json(send, 201, {"id": rid})
        return
    if method == "GET" and path.startswith("/api/runs/") and path.endswith("/events"):
        run = runs.get(path[len("/api/runs/"):-len("/events")])
        if run is None:
            await send_json(send, 404, {"error": "no such run"})
            return
        await events(receive, send, run)
        return
    await send_json(send, 404, {"error": f"no route {method} {path}"})


def main() -> None:
    import uvicorn

    host, _, port = os.environ.get("DATA_ANALYST_LISTEN", "127.0.0.1:8090").rpartition(":")
    try:
        # A page following a run keeps its event stream open until the run
        # ends: cut off after a few seconds, so that a stop reaches the
        # shutdown (which kills the runs' sandboxes) without waiting for it.
        uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="info", timeout_graceful_shutdown=3)
    finally:
        # Also when uvicorn skipped its shutdown event (a second Ctrl-C,
        # or one while a page still streams a run's events).
        kill_live_sandboxes()


if __name__ == "__main__":
    main()
