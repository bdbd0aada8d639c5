"""The console a person can trust, in headless Chromium against a real ``cox up``.

Safe approvals (no key press in a text box answers one; a security confirm shows what it
allows), a layout usable at 400, 800 and 1400 px (element sizes asserted, screenshots kept),
diffs wherever a change is shown, denied / refused / failed told apart, Back/Forward and reload,
notes that go with their state, rename on blur, the composer's keys from its buttons, Undo that
names its write, explicit new workspaces, script errors, safe Markdown, turn status, queue
management and accessibility (axe-core, from the axe-playwright-python wheel's axe.min.js).

A scenario whose outcome depends on the width (the layout, approval buttons in the viewport, the
drawers of notes and workspaces) runs at 400, 800 and 1400 px (``AT_EVERY_WIDTH``); the others
once, at 1400. Below 1000 px the sessions and the inspector are drawers: a test opens the one
its item lives in with the real toggle, as a person would. One stack and one browser serve the
whole module.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.test_console import outbox, user_texts
from tests.support import ARTIFACTS
from tests.support.browser import axe, chromium, login, new_session, pytestmark
from tests.support.browser import open_page as browser_page
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import said, tool

try:
    from playwright.sync_api import BrowserContext, FloatRect, Page, expect
except ImportError:  # pragma: no cover
    pass

__all__ = ["pytestmark"]
WIDTHS = [400, 800, 1400]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("trust")) as u:
        yield u


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    with chromium(1400) as ctx:
        yield ctx


def open_page(browser: BrowserContext, up: CoxUp, width: int = 1400, path: str = "/") -> tuple[Page, list[str]]:
    pg, errors = browser_page(browser, up.url + path, width)
    login(pg, up)
    return pg, errors


@pytest.fixture
def width(request: pytest.FixtureRequest) -> int:
    """1400 px, or each of :data:`WIDTHS` for a test marked :data:`AT_EVERY_WIDTH`."""
    return int(getattr(request, "param", 1400))


AT_EVERY_WIDTH = pytest.mark.parametrize("width", WIDTHS, indirect=True)
"""For a scenario whose outcome depends on the width (layout, drawers, what is in the viewport);
the others run once, at 1400 px."""


@pytest.fixture
def page(browser: BrowserContext, up: CoxUp, width: int) -> Iterator[Page]:
    pg, errors = open_page(browser, up, width)
    try:
        yield pg
    finally:
        pg.close()
    assert errors == [], f"the page threw: {errors}"


def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}-{page_width(page)}.png"
    page.screenshot(path=str(path))
    return path


def box(page: Page, sel: str) -> FloatRect:
    b = page.locator(sel).first.bounding_box()
    assert b is not None, f"{sel} is not laid out"
    return b


def page_width(page: Page) -> int:
    size = page.viewport_size
    assert size is not None
    return int(size["width"])


def open_drawer(page: Page, which: str) -> None:
    """Below 1000 px the sessions ("sidebar") and the inspector are drawers: open one with its
    toggle in the top bar. At 1000 px and up both are columns, always shown."""
    if page_width(page) < 1000:
        page.click(f"#toggle-{which}")
        expect(page.locator(f"#{which}")).to_be_in_viewport()


def start_session(page: Page, workspace: str) -> str:
    """Create a session in a new folder ``workspace-<width>``, from the sessions drawer when narrow
    (creating it closes the drawer)."""
    open_drawer(page, "sidebar")
    sid = new_session(page, f"{workspace}-{page_width(page)}")
    if page_width(page) < 1000:
        expect(page.locator("#sidebar")).not_to_be_in_viewport()
    return sid


# ---------------------------------------------------------------------------------- item 1
@AT_EVERY_WIDTH
def test_no_key_press_in_a_text_box_answers_an_approval(page: Page, up: CoxUp, width: int) -> None:
    ws = f"appr-{width}"
    sid = start_session(page, "appr")
    page.fill("#draft", said("Make the build dir", {"tools": [tool("run_command", command="mkdir build")]},
                             {"text": "done"}))
    page.press("#draft", "Enter")
    card = page.locator(".approval")
    expect(card).to_contain_text("Allowing runs this command:")
    expect(card.locator("pre.call")).to_have_text("mkdir build")
    msg = card.locator("input")
    msg.fill("No, don't create build/ here")
    msg.press("Enter")
    expect(card.locator("[role=alert]")).to_contain_text("Enter does not answer")
    time.sleep(0.7)  # the old handler answered at once; give a wrong answer time to be recorded
    with up.client() as api:
        s = api.session(sid)
        assert len(s["approvals"]) == 1, "Enter in the message box answered the approval"
        assert not [e for e in api.all_events(sid) if e["type"] == "approval.resolved"]
    assert not (up.root / ws / "build").exists()
    expect(card).to_be_visible()
    # The buttons are visible and inside the viewport at this width.
    for act in ("allow", "deny"):
        b = box(page, f".approval [data-act={act}]")
        assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1, (act, b)
    shot(page, "approval")
    card.locator("[data-act=deny]").click()
    expect(page.locator(".approval")).to_have_count(0)
    status = page.locator(".item.tool", has_text="mkdir build").locator(".status")
    expect(status).to_have_text("denied by you")
    assert not (up.root / ws / "build").exists()


def test_a_security_confirm_shows_the_diff_it_allows_and_enter_does_not_allow_it(page: Page, up: CoxUp, width: int) -> None:
    start_session(page, "sec")
    makefile = up.root / f"sec-{width}" / "Makefile"
    makefile.write_text("all:\n\techo old\n")
    page.fill("#draft", said("Edit the Makefile", {"tools": [tool("write_file", path="Makefile", content="all:\n\techo new\n")]}))
    page.press("#draft", "Enter")
    card = page.locator(".approval.security")
    expect(card).to_contain_text("Allowing writes Makefile")
    diff = card.locator(".diff")
    expect(diff.locator(".ln.del")).to_contain_text("echo old")
    expect(diff.locator(".ln.add")).to_contain_text("echo new")
    # The diff comes before the buttons.
    assert box(page, ".approval.security .diff")["y"] < box(page, ".approval.security [data-act=allow]")["y"]
    card.locator("input").fill("yes")
    card.locator("input").press("Enter")
    expect(card.locator("[role=alert]")).to_contain_text("Enter does not answer")
    time.sleep(0.5)
    assert makefile.read_text() == "all:\n\techo old\n"
    card.locator("[data-act=allow]").click()
    expect(page.locator(".approval")).to_have_count(0)
    expect(page.locator(".item.tool", has_text="Makefile").locator(".status")).to_have_text("done")
    assert makefile.read_text() == "all:\n\techo new\n"


# ---------------------------------------------------------------------------------- item 2
@AT_EVERY_WIDTH
def test_the_layout_is_usable_at_every_width(page: Page, up: CoxUp, width: int) -> None:
    start_session(page, "layout")
    page.fill("#draft", said("Wait for me", {"text": "Thinking about it.",
                                             "tools": [tool("run_command", command="touch layout")]}))
    page.press("#draft", "Enter")
    expect(page.locator(".approval")).to_be_visible()
    page.fill("#draft", "queued while it waits")
    page.click("#btn-queue")
    expect(outbox(page, "queue", "queued")).to_have_count(1)
    transcript, composer, draft = box(page, "#transcript"), box(page, "#composer"), box(page, "#draft")
    assert transcript["width"] >= min(width, 1400 - 230 - 340) * 0.6, transcript
    assert draft["width"] >= width * 0.5 if width < 1000 else draft["width"] >= 500, draft
    assert composer["x"] >= 0 and composer["x"] + composer["width"] <= width + 1, composer
    for b in ("#btn-send", "#btn-queue", "#btn-steer", "#btn-lead", "#btn-stop"):
        bb = box(page, b)
        assert bb["width"] > 20 and bb["height"] > 16, (b, bb)
        assert composer["x"] <= bb["x"] and bb["x"] + bb["width"] <= composer["x"] + composer["width"] + 1, (b, bb, composer)
        assert composer["y"] <= bb["y"] and bb["y"] + bb["height"] <= composer["y"] + composer["height"] + 1, (b, bb)
    if width >= 1000:
        side, insp = box(page, "#sidebar"), box(page, "#inspector")
        assert side["width"] == pytest.approx(230, abs=2) and insp["width"] == pytest.approx(340, abs=2)
        assert composer["x"] + composer["width"] <= insp["x"] + 1, "the composer runs into the inspector"
        expect(page.locator("#toggle-sidebar")).to_be_hidden()
    else:
        # Drawers: out of the way until asked for, then inside the screen, then gone again.
        expect(page.locator("#sidebar")).not_to_be_in_viewport()
        expect(page.locator("#inspector")).not_to_be_in_viewport()
        page.click("#toggle-inspector")
        expect(page.locator("#inspector")).to_be_in_viewport()
        insp = box(page, "#inspector")
        assert insp["width"] <= width and insp["x"] >= -1 and insp["x"] + insp["width"] <= width + 1, insp
        expect(page.locator("#tab-plan")).to_be_visible()
        shot(page, "drawer")
        page.keyboard.press("Escape")
        expect(page.locator("#inspector")).not_to_be_in_viewport()
        with up.client() as api:
            m = re.search(r"#/s/(\w+)", page.url)
            assert m, page.url
            sid = m.group(1)
            assert api.session(sid)["busy"], "Esc closed the drawer; it must not also stop the turn"
    shot(page, "width")
    page.locator(".approval [data-act=deny]").click()
    expect(page.locator("#state")).to_have_text("idle", timeout=30_000)


# ---------------------------------------------------------------------------------- items 3, 6 (undo)
def test_changes_and_history_show_diffs_for_every_kind_of_write(page: Page, up: CoxUp, width: int) -> None:
    sid = start_session(page, "changes")
    ws = up.root / f"changes-{width}"
    with up.client() as api:
        r = api.http.patch(f"/v1/sessions/{sid}", json={"dont_ask": True})
        assert r.status_code == 200
    page.fill("#draft", said("Write and run", {"tools": [
        tool("write_file", path="notes.txt", content="one\ntwo\n"),
        tool("run_command", command="printf 'made by a command\\n' > cmd.txt")]}, {"text": "done"}))
    page.press("#draft", "Enter")
    expect(page.locator(".item.assistant", has_text="done")).to_have_count(1)
    assert (ws / "cmd.txt").read_text() == "made by a command\n"
    open_drawer(page, "inspector")  # the rest of the test is in the inspector
    page.click(".tabs [data-tab=changes]")
    notes = page.locator("#tab-changes .file[data-path='notes.txt']")
    notes.locator("summary").click()
    expect(notes.locator(".diff .ln.add")).to_have_count(2)
    expect(notes.locator(".diff .ln.add").first).to_contain_text("one")
    expect(notes).not_to_contain_text("Preview unavailable")
    cmd = page.locator("#tab-changes .file[data-path='cmd.txt']")
    expect(cmd).to_contain_text("Changed by a command")
    cmd.locator("summary").click()
    expect(cmd.locator(".diff .ln.add")).to_contain_text("made by a command")
    shot(page, "changes-diffs")

    # Undo names the write it will undo before it is pressed, and says when it deletes.
    page.click(".tabs [data-tab=history]")
    expect(page.locator("#undo-target")).to_contain_text("delete cmd.txt (it did not exist before)")
    page.click("#btn-undo")
    expect(page.locator("#tab-history .result")).to_contain_text("deleted cmd.txt (it did not exist before that write)")
    expect(page.locator("#tab-history .result")).not_to_contain_text("put back")
    assert not (ws / "cmd.txt").exists()
    expect(page.locator("#undo-target")).to_contain_text("the write of")
    expect(page.locator("#undo-target")).to_contain_text("delete notes.txt (it did not exist before)")
    # The undo itself is a change, with its diff.
    page.click(".tabs [data-tab=changes]")
    cmd = page.locator("#tab-changes .file[data-path='cmd.txt']")
    expect(cmd).to_contain_text("Put back by Undo")
    expect(cmd).to_contain_text("deleted")
    # History: a version's diff to current, coloured and numbered.
    page.click(".tabs [data-tab=history]")
    page.fill("#history-path", "notes.txt")
    page.press("#history-path", "Enter")
    page.locator("#tab-history .versions li").first.locator("[data-act=restore]").click()
    expect(page.locator("#tab-history .result")).to_contain_text("Restored notes.txt")
    assert not (ws / "notes.txt").exists()
    page.click(".tabs [data-tab=changes]")
    expect(page.locator("#tab-changes .file[data-path='notes.txt']")).to_contain_text("Restored by you")


# ---------------------------------------------------------------------------------- item 4
def test_denied_refused_and_failed_are_three_different_things(page: Page, up: CoxUp) -> None:
    start_session(page, "fates")
    page.fill("#draft", said("Three ways to say no", {"tools": [
        tool("read_file", path="missing.txt"),
        tool("write_file", path=".env", content="SECRET=1\n"),
        tool("run_command", command="touch nope")]}, {"text": "after"}))
    page.press("#draft", "Enter")
    page.locator(".approval [data-act=deny]").click()
    expect(page.locator(".item.assistant", has_text="after")).to_have_count(1)
    failed = page.locator(".item.tool", has_text="missing.txt").locator(".status")
    refused = page.locator(".item.tool", has_text=".env").locator(".status")
    denied = page.locator(".item.tool", has_text="touch nope").locator(".status")
    expect(failed).to_have_text("failed")
    expect(refused).to_have_text(re.compile(r"^refused"))
    expect(denied).to_have_text("denied by you")
    colours = {n: loc.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor].join(' ')")
               for n, loc in (("failed", failed), ("refused", refused), ("denied", denied))}
    assert len(set(colours.values())) == 3, colours
    shot(page, "three-noes")


# ---------------------------------------------------------------------------------- item 5
def test_back_forward_reopen_the_session_and_a_reload_names_discarded_messages(page: Page, up: CoxUp) -> None:
    sid = start_session(page, "nav")
    page.fill("#draft", said("Hold on", {"tools": [tool("run_command", command="touch held")]}))
    page.press("#draft", "Enter")
    expect(page.locator(".approval")).to_be_visible()
    page.fill("#draft", "the queued text I typed")
    page.press("#draft", "Control+o")
    expect(outbox(page, "queue", "queued")).to_contain_text("the queued text I typed")
    page.goto(up.url + "/")
    expect(page.locator("#empty")).to_be_visible()
    page.go_back()
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator(".item.user").first).to_contain_text("Hold on")
    page.go_forward()
    expect(page.locator("#empty")).to_be_visible()
    page.go_back()
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator(".approval")).to_be_visible()
    expect(page.locator("#stream")).to_have_text("live")
    page.locator("#draft").press("Escape")
    expect(page.locator(".item.fate", has_text="Stop discarded 1 queued")).to_contain_text("“the queued text I typed”")
    # Another tab (or this one after a reload) only has the log: it still names the text.
    page.reload()
    expect(page.locator(".item.fate", has_text="Stop discarded 1 queued")).to_contain_text("“the queued text I typed”")
    with up.client() as api:
        added = [e for e in api.all_events(sid) if e["type"] == "queue.added"]
        assert added and added[0]["text"] == "the queued text I typed"


# ---------------------------------------------------------------------------------- item 6
@AT_EVERY_WIDTH
def test_notes_keys_rename_and_workspaces(page: Page, up: CoxUp, width: int) -> None:
    existing, typo = f"existing-ws-{width}", f"exsiting-ws-{width}"
    (up.root / existing).mkdir(parents=True, exist_ok=True)
    page.reload()
    login(page, up)
    open_drawer(page, "sidebar")
    # A typo does not create a folder: the console asks the API with create: false, which refuses
    # a missing folder (404) instead of making it; an existing workspace is offered; creating is explicit.
    page.fill("#new-workspace", typo)
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/sessions")) as sent:
        page.click("#new-session button[type=submit]")
    body = sent.value.post_data_json
    assert body is not None and body["create"] is False, body
    expect(page.locator("#new-error")).to_contain_text(f"No workspace “{typo}”")
    assert not (up.root / typo).exists()
    page.select_option("#workspace-pick", existing)
    expect(page.locator("#new-workspace")).to_have_value(existing)
    page.click("#new-session button[type=submit]")
    expect(page.locator("#workspace")).to_contain_text(existing)
    expect(page.locator("#stream")).to_have_text("live")
    if width < 1000:
        expect(page.locator("#sidebar")).not_to_be_in_viewport()

    # Rename: leaving the box saves; Esc cancels (and does not stop anything).
    page.click("#title")
    page.fill("#rename-input", "Saved on blur")
    page.locator("#draft").click()
    expect(page.locator("#title")).to_have_text("Saved on blur")
    page.click("#title")
    page.fill("#rename-input", "never saved")
    page.press("#rename-input", "Escape")
    expect(page.locator("#title")).to_have_text("Saved on blur")
    expect(page.locator("#rename-form")).to_be_hidden()

    # The composer's keys work with one of its buttons focused (and Ctrl+O is not Open File).
    # long enough that the next message is still queued behind it on a loaded machine (at 1.5 s a
    # CI run's browser pressed Ctrl+O after the turn had ended: sent at once, never queued)
    page.fill("#draft", said("Slow", {"text": "step", "delay_ms": 6000}, {"text": "slow done"}))
    page.press("#draft", "Enter")
    expect(page.locator("#state")).to_have_text("working")
    page.fill("#draft", "queued from a button")
    page.focus("#btn-steer")
    page.keyboard.press("Control+o")
    expect(outbox(page, "queue", "queued")).to_contain_text("queued from a button")
    # The note describes the queued message; it goes once that message starts.
    expect(page.locator("#composer-note")).to_contain_text("Queued (position 1)")
    expect(outbox(page, "queue", "applied")).to_have_count(1)
    expect(page.locator("#composer-note")).to_have_text("")
    expect(page.locator("#state")).to_have_text("idle")

    # a Stop ends it at once: long, so Escape arrives while it runs on a loaded machine (at 4 s a
    # CI run's turn had ended completed before it)
    page.fill("#draft", said("Slow again", {"text": "step", "delay_ms": 30_000}))
    page.press("#draft", "Enter")
    expect(page.locator("#state")).to_have_text("working")
    page.focus("#btn-lead")
    page.keyboard.press("Escape")
    expect(page.locator(".item.note", has_text="Turn ended: stopped")).to_have_count(1)

    # A broken script is an error, not an answer.
    page.fill("#draft", "Broken\n```script\n[{\"text\": \n```")
    page.press("#draft", "Enter")
    end = page.locator(".item.note.turn-end").last
    expect(end).to_contain_text("Turn ended: error")
    expect(end).to_contain_text("script block is not JSON")
    expect(end).to_have_class(re.compile(r"\bbad\b"))
    expect(page.locator(".item.assistant", has_text="script error")).to_have_count(0)


# ---------------------------------------------------------------------------------- readable messages
HOSTILE = (
    "## Result\n\nHere is **bold**, *em* and `code`.\n\n- first\n- second\n\n1. one\n2. two\n\n"
    "~~~python\ndef f(x):\n    return 'ok'  # done\n~~~\n\n"
    "A [safe link](https://example.com/docs) and [a trap](javascript:window.__pwned=1).\n\n"
    "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=2</script>"
    "<a href=\"javascript:window.__pwned=3\">raw</a>"
)


def test_markdown_is_rendered_and_hostile_text_stays_text(page: Page, up: CoxUp, width: int) -> None:
    start_session(page, "md")
    long_output = "\n".join(f"line {i}" for i in range(60))
    (up.root / f"md-{width}" / "long.txt").write_text(long_output)
    page.fill("#draft", said("Render", {"text": "Reading.", "tools": [tool("read_file", path="long.txt")]},
                             {"text": HOSTILE}))
    page.press("#draft", "Enter")
    item = page.locator(".item.assistant", has_text="Here is")
    expect(item).to_have_count(1)
    expect(item.locator("h4")).to_have_text("Result")
    expect(item.locator("strong")).to_have_text("bold")
    expect(item.locator("em")).to_have_text("em")
    expect(item.locator("ul > li")).to_have_count(2)
    expect(item.locator("ol > li")).to_have_count(2)
    expect(item.locator("pre.code .tok-kw").first).to_have_text("def")
    expect(item.locator("pre.code .tok-str")).to_have_text("'ok'")
    expect(item.locator("pre.code .tok-com")).to_have_text("# done")
    safe = item.locator("a", has_text="safe link")
    expect(safe).to_have_attribute("href", "https://example.com/docs")
    expect(safe).to_have_attribute("target", "_blank")
    expect(safe).to_have_attribute("rel", re.compile("noopener"))
    # Nothing the model wrote became markup: no image, no script, no javascript: link.
    assert page.locator("#transcript img, #transcript script").count() == 0
    assert page.locator("#transcript a[href^='javascript']").count() == 0
    assert item.locator("a").count() == 1
    expect(item).to_contain_text("<img src=x onerror=")
    expect(item).to_contain_text("[a trap](javascript:window.__pwned=1)")
    assert page.evaluate("window.__pwned") is None
    # Long tool output is folded, with its size said.
    out = page.locator(".item.tool", has_text="long.txt").locator("details.output")
    expect(out.locator("summary")).to_contain_text("60 lines")
    assert not out.evaluate("e => e.open")
    out.locator("summary").click()
    expect(out.locator("pre")).to_contain_text("line 59")
    shot(page, "markdown")


# ---------------------------------------------------------------------------------- turn status
def test_turn_status_says_what_the_turn_waits_for(page: Page, up: CoxUp) -> None:
    start_session(page, "status")
    page.fill("#draft", said("Count", {"text": "thinking", "delay_ms": 5000, "tokens": 1234,
                                       "tools": [tool("run_command", command="touch status")]},
                             {"text": "finished", "tokens": 5}))
    page.press("#draft", "Enter")
    status = page.locator("#turn-status")
    expect(status.locator(".waiting")).to_have_text("waiting for: model")
    expect(status.locator(".elapsed")).to_contain_text("turn running")
    expect(status.locator(".waiting")).to_have_text("waiting for: approval")
    expect(status.locator(".turn-tools")).to_have_text("1 tool call")
    expect(status.locator(".turn-tokens")).to_contain_text("tokens")
    tokens = int(re.sub(r"\D", "", status.locator(".turn-tokens").inner_text()))
    assert tokens >= 1234, tokens
    page.locator(".approval [data-act=allow]").click()
    expect(page.locator(".item.assistant", has_text="finished")).to_have_count(1)
    expect(status.locator(".waiting")).to_have_count(0)
    expect(status.locator(".elapsed")).to_contain_text("last turn took")
    expect(status.locator(".session-totals")).to_contain_text("session: 1 turn, 1 tool calls")


# ---------------------------------------------------------------------------------- queue management
def test_queued_messages_can_be_reordered_and_removed_before_they_start(page: Page, up: CoxUp) -> None:
    sid = start_session(page, "queue")
    page.fill("#draft", said("Hold", {"tools": [tool("run_command", command="touch hold")]}))
    page.press("#draft", "Enter")
    expect(page.locator(".approval")).to_be_visible()
    for text in ("first", "second", "third"):
        page.fill("#draft", text)
        page.press("#draft", "Control+o")
    expect(outbox(page, "queue", "queued")).to_have_count(3)
    page.locator("#outbox li", has_text="second").locator("[data-act=remove]").click()
    expect(outbox(page, "queue", "removed")).to_contain_text("second")
    expect(page.locator(".item.fate", has_text="Removed from the queue")).to_contain_text("“second”")
    page.locator("#outbox li", has_text="third").locator("[data-act=up]").click()
    expect(outbox(page, "queue", "queued").first).to_contain_text("third")
    with up.client() as api:
        assert [q["text"] for q in api.session(sid)["queue"]] == ["third", "first"]
        types = [e["type"] for e in api.all_events(sid)]
        assert "queue.removed" in types and "queue.reordered" in types
    page.locator(".approval [data-act=deny]").click()
    expect(outbox(page, "queue", "applied")).to_have_count(2)
    expect(page.locator("#state")).to_have_text("idle")
    assert user_texts(page)[1:] == ["third", "first"]
    with up.client() as api:
        started = next(e for e in api.all_events(sid) if e["type"] == "user.msg" and e["text"] == "first")
        r = api.http.delete(f"/v1/sessions/{sid}/queue/{started['message_id']}")
        assert r.status_code == 409 and r.json()["error"] == "not_queued", r.text


# ---------------------------------------------------------------------------------- accessibility
def test_accessibility_keyboard_focus_and_axe(page: Page, up: CoxUp) -> None:
    start_session(page, "a11y")
    page.fill("#draft", said("Check me", {"text": "Some **text**.", "tools": [tool("run_command", command="touch a11y")]}))
    page.press("#draft", "Enter")
    expect(page.locator(".approval")).to_be_visible()
    bad = axe(page)
    assert bad == [], [(v["id"], v["help"], [n["target"] for n in v["nodes"]][:5]) for v in bad]
    # Every composer control is reachable by Tab and shows a visible focus ring.
    page.focus("#draft")
    reached: list[str] = []
    for _ in range(12):
        page.keyboard.press("Tab")
        info = page.evaluate("() => { const e = document.activeElement; const s = getComputedStyle(e);"
                             " return [e.id, s.outlineStyle, parseFloat(s.outlineWidth)]; }")
        if info[0]:
            reached.append(info[0])
            assert info[1] != "none" and info[2] >= 2, f"no visible focus on {info}"
    assert {"btn-queue", "btn-steer", "btn-lead", "btn-stop"} <= set(reached), reached
    page.locator(".approval [data-act=deny]").click()
    expect(page.locator("#state")).to_have_text("idle")
