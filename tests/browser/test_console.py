"""The web console in a real browser: everything a newcomer does on it,
against a real server with real sandboxes."""

from __future__ import annotations

import re

import httpx
from playwright.sync_api import Page, expect

# Every form control and button must have an accessible name.
UNLABELLED = """() => [...document.querySelectorAll('button, input, select, textarea, [role=button], [role=tab], [role=textbox]')]
  .filter((e) => !e.closest('[hidden]'))
  .filter((e) => {
    if (e.getAttribute('aria-label') || e.getAttribute('aria-labelledby')) return false;
    if (e.id && document.querySelector(`label[for="${e.id}"]`)) return false;
    if (e.closest('label')) return false;
    return !(e.tagName === 'BUTTON' || e.getAttribute('role') === 'button' || e.getAttribute('role') === 'tab') || !e.textContent.trim();
  })
  .map((e) => e.outerHTML.slice(0, 120))"""


def assert_labelled(page: Page) -> None:
    assert page.evaluate(UNLABELLED) == [], "controls without a label"


def sign_in(page: Page, serve) -> None:
    page.goto(serve.url + "/")
    assert_labelled(page)
    # With the keyboard only: the key field has focus; Enter submits.
    expect(page.locator("#apikey")).to_be_focused()
    page.keyboard.type(serve.key)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Sandboxes")).to_be_visible()


def in_terminal(page: Page, keys: str, line: str, flags: str = "m") -> None:
    """Types keys and Enter into the console's terminal, then waits until
    its text matches line (a JavaScript regular expression)."""
    page.keyboard.type(keys)
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => /{line}/{flags}.test(document.getElementById('terminal').textContent)")


def create_from_form(page: Page, template: str, tag: str, idle: str = "") -> tuple:
    """Creates a sandbox with the form; returns its row (found by its
    metadata tag) and its id."""
    page.select_option("#create-template", template)
    page.fill("#create-metadata", tag)
    page.fill("#create-idle", idle)
    page.get_by_role("button", name="Create sandbox").click()
    row = page.locator("tr[data-id]", has=page.locator(".tag", has_text=tag))
    expect(row).to_have_count(1)
    return row, row.get_attribute("data-id")


def test_console_end_to_end(page: Page, serve, artifacts) -> None:
    page.on("dialog", lambda d: d.accept())
    page.goto(serve.url + "/")
    page.fill("#apikey", "pds_not_a_key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown API key")
    sign_in(page, serve)
    assert_labelled(page)

    row, sid = create_from_form(page, "code-interpreter", "suite=browser")
    expect(row.locator(".state")).to_have_text("running")
    # The filter keeps it and drops what does not match.
    page.fill("#filter", "suite=nothing")
    expect(row).to_have_count(0)
    page.fill("#filter", "suite=browser")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(5)).to_contain_text("MiB")  # memory of a live sandbox
    # The table refreshes itself; the keyboard's focus stays on its button.
    page.get_by_role("button", name=f"Extend by 10 minutes {sid}").focus()
    page.wait_for_timeout(3500)  # a poll of the table goes by
    expect(page.get_by_role("button", name=f"Extend by 10 minutes {sid}")).to_be_focused()

    # Its page: a cell that plots and shows a DataFrame.
    row.get_by_role("link", name=sid).click()
    expect(page.get_by_role("heading", name=f"Sandbox {sid}")).to_be_visible()
    assert_labelled(page)
    page.get_by_role("button", name="Run cell 1").click()
    out = page.get_by_label("Output of cell 1")
    expect(out.locator("img")).to_be_visible()
    assert out.locator("img").get_attribute("src").startswith("data:image/png;base64,")
    expect(out.locator("table.df")).to_be_visible()
    expect(out.locator("table.df")).to_contain_text("16")
    expect(page.locator("#cell-1-state")).to_contain_text("done in")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts / "console.png"), full_page=True)  # the chart and the DataFrame
    # An error shows its traceback.
    page.get_by_role("button", name="Add cell").click()
    page.fill("#cell-2", "1 / 0")
    page.keyboard.press("Shift+Enter")
    expect(page.get_by_label("Output of cell 2").get_by_role("alert")).to_contain_text("ZeroDivisionError")

    # Files: upload by drag and drop, see it listed.
    page.get_by_role("tab", name="Files").click()
    drop = page.evaluate_handle("""() => { const dt = new DataTransfer();
        dt.items.add(new File(['city,temp\\nOslo,4\\n'], 'dropped.csv', {type: 'text/csv'})); return dt; }""")
    page.dispatch_event("#dropzone", "drop", {"dataTransfer": drop})
    expect(page.locator('tr[data-name="dropped.csv"]')).to_be_visible()
    expect(page.locator('tr[data-name="dropped.csv"]')).to_contain_text("file")
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download dropped.csv").click()
    assert open(dl.value.path()).read() == "city,temp\nOslo,4\n"
    # Upload with the keyboard's file picker, then delete.
    page.set_input_files("#files-upload", {"name": "scratch.txt", "mimeType": "text/plain", "buffer": b"x"})
    expect(page.locator('tr[data-name="scratch.txt"]')).to_be_visible()
    page.get_by_role("button", name="Delete scratch.txt").click()
    expect(page.locator('tr[data-name="scratch.txt"]')).to_have_count(0)
    expect(page.locator('tr[data-name="dropped.csv"]')).to_be_visible()
    # A folder that cannot be listed leaves no other folder's rows under its
    # name (an upload would have gone where the table did not show).
    page.fill("#files-path", "/nonexistent")
    page.get_by_role("button", name="List", exact=True).click()
    expect(page.get_by_text("Could not list /nonexistent.")).to_be_visible()
    expect(page.locator('tr[data-name="dropped.csv"]')).to_have_count(0)
    page.fill("#files-path", "/home/user")
    page.get_by_role("button", name="List", exact=True).click()
    expect(page.locator('tr[data-name="dropped.csv"]')).to_be_visible()

    # Terminal: type, read the answer.
    page.get_by_role("tab", name="Terminal").click()
    page.get_by_role("button", name="Connect").click()
    expect(page.locator("#terminal-state")).to_have_text("connected")
    page.locator("#terminal").focus()
    in_terminal(page, "echo $((6*7))", r"^42\s*$")
    # Text that comes without a key of its own (Playwright inserts what a
    # US keyboard lacks, as an input method does) reaches the shell too.
    in_terminal(page, "echo 'héllo ✓ 日本 😀'", r"^héllo ✓ 日本 😀\s*$", flags="mu")
    # Option+L on a German Mac gives "@" with Alt held: the character goes,
    # not Meta (ESC) and an l.
    page.keyboard.type("echo x")
    page.evaluate("""() => document.getElementById('terminal').dispatchEvent(
        new KeyboardEvent('keydown', {key: '@', code: 'KeyL', altKey: true, bubbles: true, cancelable: true}))""")
    in_terminal(page, "y", r"^x@y\s*$")
    # Long output lands whole, drawn once per frame rather than per message.
    in_terminal(page, "seq 1 20000; echo SEQ-DONE", r"^19999\n20000\nSEQ-DONE\s*$")
    # Cursor moves the sandbox asks for stay on the screen: a count of
    # 999999999 neither hangs the page nor drops what follows.
    page.keyboard.type("printf 'x\\033[999999999Bx\\033[999999999Gy\\033[999999999;999999999Hz\\033[999999999@\\n'; echo $((6*8))")
    page.keyboard.press("Enter")
    page.wait_for_function("() => /^48\\s*$/m.test(document.getElementById('terminal').textContent)")
    assert page.evaluate("() => document.getElementById('terminal').textContent.length") < 100_000
    # The keyboard leaves the terminal with Shift+Escape and disconnects.
    page.keyboard.press("Shift+Escape")
    expect(page.locator("#terminal-connect")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#terminal-state")).to_have_text("closed")

    # History: the cell and the terminal, newest first.
    page.get_by_role("tab", name="History").click()
    page.get_by_role("button", name="Refresh history").click()
    entries = page.locator("article.history-entry")
    expect(entries.first).to_have_attribute("data-kind", "terminal")
    expect(entries.first).to_contain_text("echo $((6*7))")
    expect(entries.first.locator("pre.out")).to_contain_text(re.compile(r"^42$", re.M))
    # Its transcript (seq 1 20000 in it) is past what the history keeps: said so.
    expect(entries.first.locator(".truncated")).to_contain_text("first 64 KiB")
    expect(page.locator('article[data-kind="code"]', has_text="plt.plot")).to_have_count(1)

    # Metrics draw live figures.
    page.get_by_role("tab", name="Metrics").click()
    expect(page.locator("figcaption").nth(1)).to_contain_text("MiB of")
    expect(page.get_by_text(re.compile(r"^Disk: \S+ \S+ of \S+ \S+ used$"))).to_be_visible()

    # A runaway left behind: ended from the page, the kernels kept.
    with serve.api() as api:
        assert api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "sleep 606", "background": True}).status_code == 200
    page.get_by_role("button", name=f"End processes {sid}").click()
    expect(page.locator("#status")).to_contain_text(f"Ended 1 process in {sid}; its kernels are kept")

    # Snapshot and fork from the sandbox's page, then the tree.
    page.get_by_role("button", name=f"Snapshot {sid}").click()
    expect(page.locator("#status")).to_contain_text("Snapshot snap_")
    page.get_by_role("button", name=f"Fork {sid}").click()
    expect(page.locator("#status")).to_contain_text(f"Forked {sid} into sbx_")
    fork_id = re.search(r"into (sbx_\w+)", page.locator("#status").inner_text()).group(1)
    page.get_by_role("link", name="Snapshots").click()
    node = page.locator(f'#lineage li[data-node="{sid}"]')
    expect(node.locator("> ul > li[data-node^='snap_']")).to_have_count(1)
    expect(node.locator(f'> ul > li[data-node="{fork_id}"]')).to_contain_text("fork")
    expect(page.locator("table[aria-label=Snapshots] tr[data-id^='snap_']")).to_have_count(1)
    assert_labelled(page)
    page.screenshot(path=str(artifacts / "console-snapshots.png"))

    # Templates and keys pages render what the API says.
    page.get_by_role("link", name="Templates").click()
    tpl_row = page.locator("tr", has=page.locator("td.mono", has_text=re.compile(r"^code-interpreter$")))
    expect(tpl_row).to_have_count(1)
    expect(tpl_row.locator("td").nth(4)).to_contain_text(re.compile(r"[MG]iB"))  # size
    expect(tpl_row.locator("td").nth(5)).to_contain_text(re.compile(r"\(\d+ s\)"))  # built, and how long it took
    expect(tpl_row.locator("td").nth(6)).to_have_text(re.compile(r"^(yes|no)$"))  # warm
    expect(tpl_row.locator("td").nth(7)).to_have_text(re.compile(r"ready|none"))  # pool
    page.get_by_role("link", name="API keys").click()
    assert_labelled(page)
    page.fill("#key-name", "from-the-console")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("pds_")
    key_row = page.locator("tr[data-id]", has_text="from-the-console")
    # The console makes a key for agents by default: sandboxes, not the keys.
    expect(key_row.locator("td").nth(3)).to_have_text("sandboxes")
    scoped = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{serve.url}/v1/sandboxes", headers=scoped).status_code == 200
    refused = httpx.get(f"{serve.url}/v1/api-keys", headers=scoped)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied", refused.text
    page.get_by_role("button", name=f"Revoke {key_row.get_attribute('data-id')}").click()
    expect(key_row).to_contain_text("revoked")

    # Pause, resume and extend from the table.
    page.get_by_role("link", name="Sandboxes").click()
    fork_row = page.locator(f'tr[data-id="{fork_id}"]')
    page.get_by_role("button", name=f"Pause {fork_id}").click()
    expect(fork_row.locator(".state")).to_have_text("paused")
    page.get_by_role("button", name=f"Resume {fork_id}").click()
    expect(fork_row.locator(".state")).to_have_text("running")
    page.get_by_role("button", name=f"Extend by 10 minutes {fork_id}").click()
    expect(page.locator("#status")).to_contain_text(f"Extended {fork_id}")
    expect(fork_row.locator("td").nth(6)).to_contain_text(re.compile(r"^1[45] min"))  # 5 min of default TTL + 10

    # Kill from the table: the row goes; its page says killed.
    page.get_by_role("button", name=f"Kill {fork_id}").click()
    page.get_by_role("button", name=f"Kill {sid}").click()
    expect(page.locator(f'tr[data-id="{sid}"]')).to_have_count(0)
    page.goto(f"{serve.url}/#/sandboxes/{sid}")
    expect(page.locator(".state")).to_have_text("not found")
    expect(page.locator("#sandbox-state + .muted")).to_contain_text("killed, or no sandbox of this project")


def test_idle_sandbox_pauses_and_the_console_lets_it_sleep(page: Page, serve) -> None:
    page.on("dialog", lambda d: d.accept())
    sign_in(page, serve)
    # A sandbox that pauses itself after 2 s of nothing.
    row, sid = create_from_form(page, "base", "suite=idle", idle="2")
    # The table, which keeps polling, shows it paused for idleness.
    expect(row.locator(".state")).to_have_text("paused")
    expect(row.locator(".reason")).to_contain_text("idle: resumes on the next request")
    expect(row.get_by_role("button", name=f"Resume {sid}")).to_be_visible()

    # Its page says so too, and looking at it does not wake it.
    row.get_by_role("link", name=sid).click()
    expect(page.locator("#sandbox-state")).to_contain_text("paused (idle")
    # The tabs work with the keyboard: arrows move between them.
    page.get_by_role("tab", name="Notebook").focus()
    page.keyboard.press("ArrowLeft")
    expect(page.get_by_role("tab", name="Metrics")).to_be_focused()
    expect(page.get_by_role("tab", name="Metrics")).to_have_attribute("aria-selected", "true")
    expect(page.locator("figcaption").first).to_contain_text("paused")
    # Nor do its files and its contexts: the tab says List would resume it.
    page.get_by_role("tab", name="Files").click()
    expect(page.get_by_text("The sandbox is paused: List resumes it")).to_be_visible()
    page.get_by_role("tab", name="Notebook").click()
    page.locator("#nb-context").focus()
    page.get_by_role("tab", name="Metrics").click()
    page.wait_for_timeout(2500)  # a metrics poll and a state poll go by
    with serve.api() as api:
        assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", "viewing the sandbox woke it"
        # Awake from now on, so that it does not doze off again mid-test.
        assert api.patch(f"/v1/sandboxes/{sid}", json={"idle_timeout_seconds": 0}).status_code == 200

    # Resume from its page; the metrics come back.
    page.get_by_role("button", name=f"Resume {sid}").click()
    expect(page.locator("#sandbox-state .state")).to_have_text("running")
    expect(page.locator("figcaption").nth(1)).to_contain_text("MiB of")
    page.get_by_role("button", name=f"Kill {sid}").click()
    expect(page.locator("#sandbox-state .state")).to_have_text("killed")
    # A terminal of it cannot connect, and says why rather than guessing.
    page.get_by_role("tab", name="Terminal").click()
    page.locator("#terminal-connect").click()
    expect(page.locator("#terminal-state")).to_contain_text(re.compile(r"could not connect: .*not found"))


# A page and a service worker served by a sandbox's own web server, which
# tries what hostile code would: read the console's key from the origin's
# storage, and put a service worker over the whole origin (it would see every
# request of the console, key included).
HOSTILE_PAGE = """<!doctype html><title>hostile</title><script>
const out = {storage: JSON.stringify({...sessionStorage, ...localStorage})};
navigator.serviceWorker.register("sw.js", {scope: "/"})
  .then(() => { out.sw = "registered"; }, (e) => { out.sw = "refused: " + e.name; })
  .finally(() => { document.body.textContent = JSON.stringify(out); document.title = "done"; });
</script>"""
HOSTILE_SERVER = """
import http.server
PAGE = open("/tmp/hostile.html", "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        js = self.path.startswith("/sw.js")
        b = b"self.addEventListener('fetch', () => {});" if js else PAGE
        self.send_response(200)
        self.send_header("Content-Type", "text/javascript" if js else "text/html")
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
http.server.ThreadingHTTPServer(("0.0.0.0", 8002), H).serve_forever()
"""


def test_a_sandbox_page_cannot_reach_the_console_key(page: Page, serve) -> None:
    """The port proxy's path form serves a sandbox's pages on the console's
    origin: opened in the tab the console was signed in, such a page finds
    no key in the origin's storage and cannot widen a service worker's scope
    to the console."""
    import json
    import time

    with serve.api() as api:
        sid = api.post("/v1/sandboxes", json={"template": "base", "metadata": {"suite": "hostile-page"}}).json()["id"]
        try:
            r = api.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/hostile.html"}, content=HOSTILE_PAGE.encode())
            assert r.status_code < 300, r.text
            r = api.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": 'nohup python3 -c "$SRV" >/dev/null 2>&1 &', "env": {"SRV": HOSTILE_SERVER}})
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            token_url = api.post(f"/v1/sandboxes/{sid}/ports/8002/token").json()["url"]
            deadline = time.monotonic() + 30
            while api.get(f"/v1/sandboxes/{sid}/ports/8002/").status_code != 200:
                assert time.monotonic() < deadline, "the sandbox's server did not start"
                time.sleep(0.2)

            sign_in(page, serve)
            page.goto(token_url)
            page.wait_for_function("() => document.title === 'done'")
            out = json.loads(page.locator("body").inner_text())
            assert "pds_" not in out["storage"], out
            assert out["sw"].startswith("refused"), out
        finally:
            api.delete(f"/v1/sandboxes/{sid}")


def test_notebook_interrupts_and_keeps_html_whole(page: Page, serve) -> None:
    """A cell can be interrupted from the notebook; leaving the page cancels
    a running cell instead of leaving its context busy; HTML that is more
    than a table is shown whole, not cut down to its first table."""
    page.on("dialog", lambda d: d.accept())
    sign_in(page, serve)
    row, sid = create_from_form(page, "code-interpreter", "suite=interrupt")
    expect(row.locator(".state")).to_have_text("running")
    row.get_by_role("link", name=sid).click()

    page.fill("#cell-1", "import time\nfor i in range(600):\n    time.sleep(0.1)")
    page.get_by_role("button", name="Run cell 1").click()
    # The keyboard's Run does nothing while the cell runs.
    expect(page.locator("#cell-1-state")).to_have_text("running…")
    page.locator("#cell-1").press("Shift+Enter")
    page.wait_for_timeout(500)
    expect(page.locator("#cell-1-state")).to_have_text("running…")
    expect(page.get_by_label("Output of cell 1").get_by_role("alert")).to_have_count(0)
    page.get_by_role("button", name="Interrupt cell 1").click()
    out = page.get_by_label("Output of cell 1")
    expect(out.get_by_role("alert")).to_contain_text("KeyboardInterrupt")
    expect(page.locator("#cell-1-state")).to_contain_text("with an error")
    expect(page.get_by_role("button", name="Interrupt cell 1")).to_be_hidden()

    # A long cell, then away and back: the context is free at once.
    page.fill("#cell-1", "import time\ntime.sleep(120)")
    page.get_by_role("button", name="Run cell 1").click()
    expect(page.locator("#cell-1-state")).to_have_text("running…")
    page.get_by_role("link", name="Sandboxes").click()
    page.locator(f'tr[data-id="{sid}"]').get_by_role("link", name=sid).click()
    page.fill("#cell-1", "21 * 2")
    page.get_by_role("button", name="Run cell 1").click()
    expect(page.get_by_label("Output of cell 1")).to_contain_text("42")

    # A heading, a table with markup in its cells, a note: all of it shows.
    page.fill("#cell-1", 'from IPython.display import HTML, display\n'
              'display(HTML("<h3>Quarterly report</h3><table><tr><td><b>100</b> USD</td></tr></table><p>Note: unaudited</p>"))')
    page.get_by_role("button", name="Run cell 1").click()
    out = page.get_by_label("Output of cell 1")
    expect(out.locator("iframe")).to_have_count(1)
    expect(out.locator("table.df")).to_have_count(0)
    # A table alone is rebuilt as a table; a cell's markup leaves its text.
    page.fill("#cell-1", 'from IPython.display import HTML, display\n'
              'display(HTML("<table><tr><th>revenue</th></tr><tr><td><b>100</b> USD</td></tr></table>"))')
    page.get_by_role("button", name="Run cell 1").click()
    expect(out.locator("table.df td")).to_have_text("100 USD")
    # A long DataFrame: its table, and the line saying how big it is.
    page.fill("#cell-1", "import pandas as pd\npd.DataFrame({'a': range(100)})")
    page.get_by_role("button", name="Run cell 1").click()
    expect(out.locator("table.df")).to_be_visible()
    expect(out).to_contain_text("100 rows × 1 columns")
    page.get_by_role("button", name=f"Kill {sid}").click()
    expect(page.locator("#sandbox-state .state")).to_have_text("killed")


def test_a_server_out_of_reach_is_said_so(page: Page, serve) -> None:
    """When the API stops answering, the console says the server cannot be
    reached, not the browser's "Failed to fetch"."""
    sign_in(page, serve)
    page.route("**/v1/sandboxes**", lambda route: route.abort("connectionrefused"))
    expect(page.get_by_text(re.compile("cannot reach the PandaStack server")).first).to_be_visible(timeout=15_000)
    expect(page.get_by_text("Failed to fetch")).to_have_count(0)
    page.unroute("**/v1/sandboxes**")


def test_a_phone_sized_window_keeps_the_page_on_screen(page: Page, serve) -> None:
    """At a phone's width the navigation wraps and Sign out stays on the
    screen; the sandbox table scrolls inside itself, not the page."""
    page.set_viewport_size({"width": 390, "height": 800})
    sign_in(page, serve)
    signout = page.get_by_role("button", name="Sign out")
    expect(signout).to_be_visible()
    box = signout.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390, box
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
