"""The data-analyst example app in a real browser, with the scripted demo
model (offline): upload a CSV, watch the steps stream in."""

from __future__ import annotations

import math

from playwright.sync_api import Page, expect


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
