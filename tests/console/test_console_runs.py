"""Runs in the web console, in headless Chromium against a real ``cox up`` (docs/api.md, Runs).

A run is started with the API (the console never starts one). The session list shows it with a
"run" badge (state, confirm mode, turns) and under "Runs only"; opening it shows the live
transcript with the badge and the banner over the composer; a message is refused with the
server's ``run_active`` said plainly and stays in the box; Stop ends the run (``run.end
stopped``) and the composer works as a chat again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.console.test_console import browser, login, page, pytestmark, shot
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import script, tool

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - test_console's marks skip the module then
    pass

__all__ = ["browser", "page", "pytestmark"]  # the fixtures and skip marks of test_console.py

# Three tool calls a turn: the run's first turn (four calls) ends hard_budget and the run goes on.
CONFIG = """
[limits]
tool_calls = 3
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("console-runs"), CONFIG) as u:
        yield u


def api(up: CoxUp) -> httpx.Client:
    return httpx.Client(base_url=up.url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30)


def start_run(up: CoxUp, text: str, **body: Any) -> dict[str, Any]:
    with api(up) as c:
        r = c.post("/v1/runs", json={"text": text, **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def events(up: CoxUp, sid: str) -> list[dict[str, Any]]:
    with api(up) as c:
        r = c.get(f"/v1/sessions/{sid}/events", params={"format": "json", "after": 0})
    assert r.status_code == 200, r.text
    return list(r.json())


def test_a_run_shows_its_badge_its_live_turns_and_its_stop_and_then_is_a_chat(page: Page, up: CoxUp) -> None:
    login(page, up)
    # Turn 1: four calls (over the limit of three) -> hard_budget -> the run's "continue";
    # turn 2 streams slowly, so the run is still driving while the person looks at it.
    text = script({"tools": [tool("find_files", pattern=f"*.{x}") for x in "abcd"]},
                  {"text": "Working slowly on the second turn.", "delay_ms": 60_000})
    run = start_run(up, text, workspace="console-run", max_turns=5)
    sid = run["session_id"]
    assert run["run"]["state"] == "running"

    # The list picks it up by itself (it is polled), with the run's state, confirm and turns.
    entry = page.locator(f"#sessions a[data-sid='{sid}']")
    expect(entry).to_be_visible(timeout=20_000)
    badge = entry.locator(".run-badge")
    expect(badge).to_contain_text("run · running · confirm person")
    expect(badge).to_contain_text("turn 2 of 5", timeout=30_000)
    expect(entry).to_have_attribute("data-run", "running")

    # "Runs only" lists GET /v1/runs: this run, not an ordinary chat.
    with api(up) as c:
        chat = c.post("/v1/sessions", json={"workspace": "console-chat"}).json()["id"]
    page.reload()
    expect(page.locator(f"#sessions a[data-sid='{chat}']")).to_be_visible()
    page.check("#runs-only")
    expect(page.locator(f"#sessions a[data-sid='{sid}']")).to_be_visible()
    expect(page.locator(f"#sessions a[data-sid='{chat}']")).to_have_count(0)
    page.uncheck("#runs-only")
    expect(page.locator(f"#sessions a[data-sid='{chat}']")).to_be_visible()

    # Open it: the transcript as any session's, the run's badge in the head, the banner.
    page.click(f"#sessions a[data-sid='{sid}']")
    expect(page.locator("#stream")).to_have_text("live")
    head = page.locator("#run")
    expect(head).to_be_visible()
    expect(head).to_have_text("run · running · confirm person · turn 2 of 5")
    expect(page.locator(".item.note", has_text="Run started")).to_contain_text("confirm person, at most 5 turns")
    expect(page.locator(".item.note", has_text="Turn ended: hard_budget")).to_have_count(1)
    expect(page.locator(".item.user", has_text="continue").locator(".via")).to_have_text("sent by the run")
    expect(page.locator(".item.assistant.streaming")).to_contain_text("Working", timeout=30_000)
    banner = page.locator("#run-banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("A run drives this session (confirm person, turn 2 of 5)")
    expect(page.locator("#btn-stop")).to_be_enabled()

    # A message while it drives: the server's run_active, said as such; the text stays.
    page.fill("#draft", "let me in")
    page.press("#draft", "Enter")
    note = page.locator("#composer-note")
    expect(note).to_contain_text("a run drives this session (409 run_active)")
    expect(note).to_have_class("note error")
    expect(page.locator("#draft")).to_have_value("let me in")
    page.click("#btn-queue")
    expect(note).to_contain_text("run_active")
    assert not [e for e in events(up, sid) if e["type"] == "user.msg" and e["text"] == "let me in"], "nothing recorded"
    shot(page, "run-driving")

    # Stop (Esc) ends the turn and the run.
    page.locator("#draft").press("Escape")
    expect(note).to_contain_text("Stopped. the run ends (run.end stopped).")
    expect(page.locator(".item.note", has_text="Run ended")).to_contain_text("Run ended: stopped after 2 turns")
    expect(head).to_have_text("run · ended stopped · 2 turns · confirm person")
    expect(head).to_have_attribute("data-state", "ended")
    expect(banner).to_be_hidden()
    expect(page.locator(f"#sessions a[data-sid='{sid}'] .run-badge")).to_contain_text("ended stopped")
    evs = events(up, sid)
    ends = [e for e in evs if e["type"] == "run.end"]
    assert [(e["outcome"], e["turns"]) for e in ends] == [("stopped", 2)]

    # After run.end the composer is a chat's: the box still holds the refused text; Enter sends it.
    expect(page.locator("#btn-send")).to_be_enabled()
    page.press("#draft", "Enter")
    expect(page.locator(".item.user", has_text="let me in")).to_have_count(1)
    expect(page.locator(".item.note", has_text="Turn ended: completed")).to_have_count(1, timeout=30_000)
    expect(page.locator("#state")).to_have_text("idle")
    expect(page.locator("#draft")).to_have_value("")
    msgs = [e for e in events(up, sid) if e["type"] == "user.msg"]
    assert msgs[-1]["via"] == "send" and msgs[-1]["text"] == "let me in"
    shot(page, "run-ended")
