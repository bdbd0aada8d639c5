"""The web console, driven in headless Chromium against a real ``cox up``.

A person's whole path, asserted on what the page shows: create a session, send, queue two,
steer, Lead (and a Lead that fails to save), answer an approval with a message, Stop, the plan,
the Changes tab, History with diff/Restore/Undo, rename, the model picker and the don't-ask
switch, and a stream that survives the gateway being killed. Screenshots go to
``tests/artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ARTIFACTS
from tests.support.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    chromium,
    login,
    new_session,
    open_page,
    pytestmark,
    sync_playwright,
)
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import said, tool

try:
    from playwright.sync_api import BrowserContext, Page, expect
except ImportError:  # pragma: no cover - the marks skip the module then
    pass

# Re-exported for the console modules that import them from here.
__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "login", "new_session", "pytestmark", "sync_playwright"]

# A second configured model, so the model picker has a choice (it is never called).
CONFIG = """
[[model.providers]]
name = "other"
kind = "openai"
model = "never-called"
base_url = "http://127.0.0.1:9/v1"
api_key = "unused"
"""
LONG = "a long line that must wrap inside the narrow pane " * 8


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("console"), CONFIG) as u:
        yield u


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    with chromium(1360) as ctx:
        yield ctx


@pytest.fixture
def page(browser: BrowserContext, up: CoxUp) -> Iterator[Page]:
    pg, errors = open_page(browser, up.url + "/")
    try:
        yield pg
    finally:
        pg.close()
    assert errors == [], f"the page threw: {errors}"


def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    page.screenshot(path=str(path))
    return path


def outbox(page: Page, kind: str, fate: str) -> Any:
    return page.locator(f"#outbox li[data-kind='{kind}'][data-fate='{fate}']")


def user_texts(page: Page) -> list[str]:
    return [t.strip() for t in page.locator(".item.user").evaluate_all(
        "els => els.map(e => e.lastChild.textContent)")]


def test_a_person_steers_a_turn_from_the_console(page: Page, up: CoxUp) -> None:
    login(page, up)
    sid = new_session(page, "web")
    expect(page.locator("#title")).to_have_text("untitled")
    expect(page.locator("#state")).to_have_text("idle")
    expect(page.locator(f"#sessions a[data-sid='{sid}']")).to_be_visible()

    # Send (Enter): a plan, a write, then a command the rules judge refuses -> the person.
    first = said("Write the notes", {
        "text": "Planning the notes.",
        "tools": [tool("plan_write", steps=["write the notes", "check them", "finish"]),
                  tool("plan_step", step=1), tool("write_file", path="notes.txt", content="first draft\n"),
                  tool("run_command", command="touch checked"), tool("write_file", path="later.txt", content="x")],
    }, {"text": "Checked."})
    page.fill("#draft", first)
    page.press("#draft", "Enter")
    card = page.locator(".approval")
    expect(card).to_contain_text("Approval needed")
    expect(card).to_contain_text("touch checked")
    expect(card.locator(".judge")).to_contain_text("said refuse")
    expect(card.locator(".judge")).to_contain_text("not a known read-only command")
    expect(page.locator("#draft")).to_have_value("")
    expect(page.locator("#state")).to_have_text("working")
    expect(page.locator(".item.assistant").first).to_have_text("Planning the notes.")
    expect(page.locator("#tab-plan li")).to_have_count(3)
    expect(page.locator("#tab-plan li.done")).to_have_count(1)
    expect(page.locator("#tab-plan li.done")).to_contain_text("write the notes")

    # While the turn runs, Send is refused and the draft stays.
    expect(page.locator("#btn-send")).to_be_disabled()
    page.fill("#draft", "plain while busy")
    page.press("#draft", "Enter")
    expect(page.locator("#composer-note")).to_contain_text("Send is refused")
    expect(page.locator("#draft")).to_have_value("plain while busy")

    # Queue two: Ctrl+O, then the Queue button.
    q1 = said("first queued", {"tools": [tool("run_command", command="touch second")]}, {"text": "never reached"})
    page.fill("#draft", q1)
    page.press("#draft", "Control+o")
    expect(outbox(page, "queue", "queued")).to_have_count(1)
    page.fill("#draft", "second queued")
    page.click("#btn-queue")
    expect(outbox(page, "queue", "queued")).to_have_count(2)
    expect(page.locator("#composer-note")).to_contain_text("Queued (position 2)")

    # A Lead that cannot be saved (too large) keeps the draft; then a Lead that is saved.
    big = "x" * (33 * 1024)
    page.fill("#draft", big)
    page.click("#btn-lead")
    expect(page.locator("#composer-note")).to_contain_text("Lead not saved")
    assert page.input_value("#draft") == big
    lead = said("Lead: rewrite the notes", {"tools": [tool("write_file", path="notes.txt",
                                                                content=f"second draft\n{LONG}\n")]},
                  {"text": "Lead applied: notes rewritten."})
    page.fill("#draft", lead)
    page.press("#draft", "Control+l")
    expect(outbox(page, "lead", "pending")).to_have_count(1)
    expect(page.locator("#composer-note")).to_contain_text("Lead saved")
    # The Lead waits: the pending approval stays open.
    expect(card).to_be_visible()
    shot(page, "mid-turn")  # docs/console.png is this view

    # Answer the approval with a message (allow + message = augment).
    card.locator("input").fill("augment: also note the check")
    card.locator("[data-act=allow]").click()
    expect(page.locator(".approval")).to_have_count(0)
    expect(page.locator(".item.tool", has_text="touch checked")).to_contain_text(
        "Allowed by person — “augment: also note the check”")
    expect(outbox(page, "lead", "applied")).to_have_count(1)
    # The call the old response had not started is skipped for the Lead, and says so.
    expect(page.locator(".item.tool", has_text="later.txt").locator(".status")).to_have_text("skipped (lead)")
    expect(page.locator(".item.assistant", has_text="Lead applied: notes rewritten.")).to_have_count(1)

    # The first queued message runs and waits on its approval; steer past it (Ctrl+S).
    expect(page.locator(".approval")).to_contain_text("touch second")
    expect(outbox(page, "queue", "applied")).to_have_count(1)
    expect(outbox(page, "queue", "queued")).to_have_count(1)
    page.fill("#draft", "steer: go another way")
    page.press("#draft", "Control+s")
    expect(page.locator(".item.note", has_text="Turn ended: stopped")).to_have_count(1)
    expect(outbox(page, "steer", "applied")).to_have_count(1)
    expect(outbox(page, "queue", "applied")).to_have_count(2)
    expect(page.locator("#state")).to_have_text("idle")
    expect(page.locator(".approval")).to_have_count(0)
    expect(page.locator(".item.assistant", has_text="echo: second queued")).to_have_count(1)
    texts = user_texts(page)
    assert texts == [first, "augment: also note the check", lead, q1, "steer: go another way", "second queued"], texts
    expect(page.locator(".item.tool", has_text="touch second").locator(".status")).not_to_have_text("done")
    assert not (Path(up.root / "web") / "later.txt").exists()
    shot(page, "after-steer")

    # Changes: the latest record per file, labelled as a preview.
    page.click(".tabs [data-tab=changes]")
    change = page.locator("#tab-changes .file[data-path='notes.txt']")
    expect(change).to_be_visible()
    change.locator("summary").click()
    expect(change).to_contain_text("Approved preview — not proof of a successful write")
    shot(page, "changes")

    # History: versions of notes.txt, diff to current (wrapped, numbered), Restore, Undo.
    ws = Path(up.root / "web")
    assert (ws / "notes.txt").read_text() == f"second draft\n{LONG}\n"
    page.click(".tabs [data-tab=history]")
    page.fill("#tab-history form input", "notes.txt")
    page.click("#tab-history form button")
    versions = page.locator("#tab-history .versions li")
    expect(versions.first).to_contain_text("write")
    assert versions.count() >= 2
    newest = versions.first
    newest.locator("[data-act=diff]").click()
    diff = page.locator("#tab-history .diff-box")
    expect(diff.locator(".ln.del")).to_contain_text("first draft")
    expect(diff.locator(".ln.add").first).to_contain_text("second draft")
    expect(diff.locator(".ln.add .num.new").first).to_have_text("1")
    long_line = diff.locator(".ln.add", has_text="must wrap")
    wrap = long_line.locator(".text").evaluate(
        "e => ({sw: e.scrollWidth, cw: e.clientWidth, h: e.getBoundingClientRect().height,"
        " lh: parseFloat(getComputedStyle(e).lineHeight) || 16,"
        " pane: [e.closest('.tab').scrollWidth, e.closest('.tab').clientWidth]})")
    assert wrap["sw"] <= wrap["cw"] + 1, f"the long line scrolls sideways: {wrap}"
    assert wrap["h"] > 2 * wrap["lh"], f"the long line did not wrap: {wrap}"
    assert wrap["pane"][0] <= wrap["pane"][1] + 1, f"the pane scrolls sideways: {wrap}"
    shot(page, "history-diff")

    newest.locator("[data-act=restore]").click()
    expect(page.locator("#tab-history .result")).to_contain_text("Restored notes.txt")
    assert (ws / "notes.txt").read_text() == "first draft\n"
    expect(page.locator(".item.note", has_text="Changed notes.txt by restore")).to_have_count(1)
    page.click("#btn-undo")
    expect(page.locator("#tab-history .result")).to_contain_text("Undid the latest write")
    assert (ws / "notes.txt").read_text() == f"second draft\n{LONG}\n"
    shot(page, "history-restored")

    # Every event is shown once: the seqs the page applied are 1..N with no gap.
    seen = page.evaluate("window.cox.model.seen")
    assert seen == list(range(1, len(seen) + 1))


def test_stop_shows_every_fate_and_the_session_settings(page: Page, up: CoxUp) -> None:
    login(page, up)
    sid = new_session(page, "web-stop")

    # Rename, model picker, don't-ask.
    page.click("#title")
    page.fill("#rename-input", "Console checks")
    page.press("#rename-input", "Enter")
    expect(page.locator("#title")).to_have_text("Console checks")
    expect(page.locator("#title-source")).to_have_text("renamed")
    expect(page.locator(f"#sessions a[data-sid='{sid}']")).to_contain_text("Console checks")
    page.select_option("#model", "other")
    expect(page.locator(".item.note", has_text='model = "other"')).to_have_count(1)
    page.select_option("#model", "script")
    expect(page.locator(".item.note", has_text='model = "script"')).to_have_count(1)

    # A security confirm is marked as such and offers no "always".
    page.fill("#draft", said("Edit the Makefile", {"tools": [
        tool("plan_write", steps=["edit the Makefile", "run make"]), tool("plan_step", step=1),
        tool("write_file", path="Makefile", content="all:\n")]}))
    page.press("#draft", "Enter")
    card = page.locator(".approval.security")
    expect(card).to_contain_text("Security confirm")
    expect(card).to_contain_text("protected path")
    expect(card.locator("[data-act=always]")).to_have_count(0)

    page.fill("#draft", "to be discarded")
    page.press("#draft", "Control+o")
    page.fill("#draft", "a Lead that will not be applied")
    page.press("#draft", "Control+l")
    expect(outbox(page, "queue", "queued")).to_have_count(1)
    expect(outbox(page, "lead", "pending")).to_have_count(1)
    shot(page, "before-stop")

    page.locator("#draft").press("Escape")
    expect(outbox(page, "queue", "discarded")).to_contain_text("to be discarded")
    expect(outbox(page, "lead", "unapplied")).to_contain_text("a Lead that will not be applied")
    expect(page.locator("#composer-note")).to_contain_text("1 queued discarded")
    expect(page.locator(".item.fate", has_text="Stop discarded 1 queued")).to_have_count(1)
    expect(page.locator(".item.fate", has_text="not applied")).to_have_count(1)
    expect(page.locator(".approval")).to_have_count(0)
    expect(page.locator("#state")).to_have_text("idle")
    assert not (Path(up.root / "web-stop") / "Makefile").exists()
    shot(page, "after-stop")

    # A Lead with no turn running is refused and the draft stays.
    page.fill("#draft", "lead with nothing running")
    page.press("#draft", "Control+l")
    expect(page.locator("#composer-note")).to_contain_text("No turn is running")
    expect(page.locator("#draft")).to_have_value("lead with nothing running")
    page.click("#outbox-clear")
    expect(page.locator("#outbox")).to_be_hidden()

    # Don't ask: the command the judge refuses is answered without the person; it survives a reload.
    page.check("#dont-ask")
    expect(page.locator(".item.note", has_text="dont_ask = true")).to_have_count(1)
    page.reload()
    expect(page.locator("#dont-ask")).to_be_checked()
    expect(page.locator("#title")).to_have_text("Console checks")
    page.fill("#draft", said("Touch it", {"tools": [tool("run_command", command="touch done")]}, {"text": "Touched."}))
    page.press("#draft", "Enter")
    expect(page.locator(".item.assistant", has_text="Touched.")).to_have_count(1)
    expect(page.locator(".item.tool", has_text="touch done")).to_contain_text("the don't-ask switch is on")
    # The stopped turn's plan was carried into this one, with its mark.
    expect(page.locator("#tab-plan .carried")).to_contain_text("Carried from an unfinished turn (1 of 2 done)")
    expect(page.locator("#tab-plan li.done")).to_have_text("✓ edit the Makefile")
    # After the reload the settled fates are in the transcript, not in the waiting list.
    expect(page.locator(".item.fate", has_text="Stop discarded 1 queued")).to_have_count(1)
    expect(page.locator("#outbox")).to_be_hidden()


def test_the_stream_resumes_after_the_gateway_dies_with_no_duplicate_or_missing_event(page: Page, up: CoxUp) -> None:
    login(page, up)
    sid = new_session(page, "web-reconnect")
    # Each step runs a different command: the progress guard ends a turn that repeats itself.
    steps = [{"text": f"step {i}", "delay_ms": 700, "tools": [tool("run_command", command=f"echo {i}")]}
             for i in range(1, 7)]
    page.fill("#draft", said("Count slowly", *steps, {"text": "all steps done"}))
    page.press("#draft", "Enter")
    expect(page.locator(".item.assistant", has_text="step 1")).to_have_count(1)
    up.kill_gateway()
    expect(page.locator("#stream")).to_have_text("reconnecting")
    up.wait_healthy()
    expect(page.locator("#stream")).to_have_text("live")
    expect(page.locator(".item.assistant", has_text="all steps done")).to_have_count(1)
    expect(page.locator("#state")).to_have_text("idle")
    assert page.evaluate("window.cox.stream.connects") >= 2
    with up.client() as api:
        events = api.all_events(sid)
    seen = page.evaluate("window.cox.model.seen")
    assert seen == [e["seq"] for e in events], "every event once, in order"
    texts = page.locator(".item.assistant").all_inner_texts()
    assert texts == [f"step {i}" for i in range(1, 7)] + ["all steps done"]
    assert page.locator(".item.tool").count() == 6
    shot(page, "reconnected")


def test_fork_and_rewind_from_a_turn_of_the_transcript(page: Page, up: CoxUp) -> None:
    """Every ended turn offers Fork and Rewind: a rewind asks the scope and shows as a divider;
    a fork opens the new session, its copied turns and the fork note shown."""
    login(page, up)
    sid = new_session(page, "web-fork")
    for n, text in enumerate(["first", "second"], start=1):
        page.fill("#draft", said(text, {"tools": [tool("write_file", path="f.txt", content=text)]}, {"text": "ok"}))
        page.press("#draft", "Enter")
        expect(page.locator(".item.note.turn-end")).to_have_count(n)
        expect(page.locator("#state")).to_have_text("idle")
    ends = page.locator(".item.note.turn-end")
    expect(ends.nth(0).locator("[data-turn-act=fork]")).to_have_text("Fork at turn 1")
    expect(ends.nth(1).locator("[data-turn-act=fork]")).to_have_text("Fork at turn 2")

    # Rewind the files to turn 1: the dialog asks the scope with three buttons
    ends.nth(0).locator("[data-turn-act=rewind]").click()
    page.locator("#rewind [data-scope=files]").click()
    rewound = page.locator(".item.note.rewound")
    expect(rewound).to_contain_text("Rewound the files to the end of turn 1 (put back: f.txt)")
    expect(page.locator("#composer-note")).to_contain_text("Rewound (files) to the end of turn 1")
    # Cancel records nothing
    ends.nth(0).locator("[data-turn-act=rewind]").click()
    page.click("#rewind-cancel")
    expect(page.locator("#rewind")).to_be_hidden()
    expect(rewound).to_have_count(1)

    # Fork at turn 1: the new session opens with turn 1 only
    ends.nth(0).locator("[data-turn-act=fork]").click()
    expect(page).not_to_have_url(re.compile(f"#/s/{sid}$"))
    expect(page.locator(".item.note.forked")).to_contain_text(f"Forked from {sid} at its turn 1")
    expect(page.locator(".item.note.turn-end")).to_have_count(1)
    assert [t.splitlines()[0] for t in user_texts(page)] == ["first"]
    expect(page.locator("#title")).to_contain_text("(fork)")
    shot(page, "fork")



@pytest.mark.parametrize("fails", [1, 2])
def test_a_module_that_does_not_load_reloads_the_page_once_then_says_which_file(browser: BrowserContext,
                                                                                 up: CoxUp, fails: int) -> None:
    """The console is a graph of modules: one that fails to load (a dropped connection, the
    gateway restarting) leaves none run. The page reloads once by itself (``fails`` = 1: then it
    opens); when the file still does not come (2), it says which one and offers a Reload, never a
    blank page (CI saw the blank page: neither the login form nor the console shown, stop 53)."""
    pg = browser.new_page()
    left = [fails]
    loads: list[str] = []

    def drop(route: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            route.abort("connectionreset")
        else:
            route.continue_()

    pg.route("**/static/js/view.js", drop)
    pg.on("load", lambda _: loads.append("load"))
    try:
        pg.goto(up.url + "/")
        if fails == 1:
            expect(pg.locator("#login:not([hidden]), #app:not([hidden])").first).to_be_visible()
            assert pg.evaluate("() => !!window.cox") and pg.locator("#boot-error").is_hidden()
            assert pg.evaluate("() => sessionStorage.getItem('cox.boot')") is None
        else:
            expect(pg.locator("#boot-error")).to_be_visible()
            expect(pg.locator("#boot-error")).to_contain_text("/static/js/view.js")
            assert pg.locator("#login").is_hidden() and pg.locator("#app").is_hidden()
        assert len(loads) == 2, f"one reload, not a loop: {loads}"
        if fails == 2:
            pg.click("#boot-error button")
            expect(pg.locator("#login:not([hidden]), #app:not([hidden])").first).to_be_visible()
    finally:
        pg.close()
