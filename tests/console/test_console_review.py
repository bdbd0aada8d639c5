"""The console a person prefers (issue 27), in headless Chromium against a real ``cox up``.

Signals that say "needs you" (tab title, favicon, the list, a live announcement, focus, a
notification asked once), every event deliberately rendered (usage in the status line, never a
bare type name), focus where the next action is and a shortcut sheet, a quieter transcript,
Review (inline diffs on each card, the net diff of a session and of a turn, Restore and Undo from
there) and the Rewind dialog. Screenshots go to ``tests/artifacts/``; axe-core runs at every
width used. One stack and one browser serve the whole module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ARTIFACTS
from tests.support.browser import chromium, login, no_serious_axe, pytestmark
from tests.support.browser import open_page as browser_page
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import said, tool

try:
    from playwright.sync_api import BrowserContext, Page, expect
except ImportError:  # pragma: no cover
    pass

__all__ = ["pytestmark"]

# Records what the page asks of the Notification API (the real one stays underneath).
NOTIFY_SPY = """
if (window.Notification) {
  window.__notes = [];
  const Real = window.Notification;
  class Spy extends Real { constructor(title, opts) { super(title, opts); window.__notes.push({title, body: opts && opts.body}); } }
  window.Notification = Spy;
}
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("review")) as u:
        yield u


@pytest.fixture(scope="module")
def browser(up: CoxUp) -> Iterator[BrowserContext]:
    with chromium(1400, init_script=NOTIFY_SPY) as ctx:
        yield ctx


def open_page(browser: BrowserContext, up: CoxUp, width: int) -> tuple[Page, list[str]]:
    return browser_page(browser, up.url + "/", width)


@pytest.fixture
def width(request: pytest.FixtureRequest) -> int:
    return int(getattr(request, "param", 1400))


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
    size = page.viewport_size
    path = ARTIFACTS / f"console-{name}-{size['width'] if size else 0}.png"
    page.screenshot(path=str(path))
    return path


def active(page: Page) -> dict[str, Any]:
    """What has the keyboard focus: its id, tag, data-act and whether it sits in an approval card."""
    out: dict[str, Any] = page.evaluate(
        "() => { const e = document.activeElement; return {id: e.id, tag: e.tagName, act: e.dataset?.act || null,"
        " role: e.getAttribute('role'), approval: !!e.closest('.approval'), tab: e.dataset?.tab || null}; }")
    return out


def create(page: Page, workspace: str) -> str:
    """A new session in a new folder, from the sessions drawer when narrow, by keyboard only."""
    size = page.viewport_size
    if size and size["width"] < 1000:
        page.click("#toggle-sidebar")
    page.fill("#new-workspace", workspace)
    page.check("#new-create")
    page.press("#new-workspace", "Enter")
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator("#stream")).to_have_text("live")
    m = re.search(r"#/s/([A-Za-z0-9_-]+)$", page.url)
    assert m, page.url
    return m.group(1)


# ---------------------------------------------------------------------------------- items 1 and 4
def test_needs_you_in_the_title_favicon_list_announced_focused_and_notified(
        page: Page, up: CoxUp, browser: BrowserContext) -> None:
    login(page, up)
    expect(page.locator("h1")).to_have_count(1)
    # The notification is optional and asked once: after the answer the offer is gone.
    expect(page.locator("#notify")).to_be_visible()
    browser.grant_permissions(["notifications"], origin=up.url)  # what the person answers
    page.click("#notify")
    expect(page.locator("#notify")).to_be_hidden()
    expect(page.locator("#notify-state")).to_contain_text("Notifications on")
    assert page.evaluate("localStorage.getItem('cox.notify-asked')") == "1"
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#notify")).to_be_hidden()

    sid = create(page, "needs")
    expect(page).to_have_title(re.compile(r"^untitled · coxswain$"))
    # This tab is not in front: a notification may come.
    page.evaluate("document.hasFocus = () => false")
    page.fill("#draft", said("Make the build dir", {"text": "On it.", "tools": [tool("run_command", command="mkdir build")]},
                             {"text": "done"}))
    page.press("#draft", "Enter")
    card = page.locator(".approval")
    expect(card).to_be_visible()
    expect(page).to_have_title(re.compile(r"^\(1\) Needs you · "))
    expect(page.locator("#favicon")).to_have_attribute("data-count", "1")
    assert (page.locator("#favicon").get_attribute("href") or "").startswith("data:image/png")
    link = page.locator(f"#sessions a[data-sid='{sid}']")
    expect(link).to_have_attribute("data-state", "needs")
    expect(link.locator(".needs-badge")).to_have_text("needs you")
    expect(page.locator("#announce")).to_have_text(re.compile("Approval needed: run_command"))
    # Focus is on the new approval's first button (Allow), so a keyboard answers it at once.
    page.wait_for_function("document.activeElement && document.activeElement.dataset.act === 'allow'")
    notes = page.evaluate("window.__notes")
    assert notes and notes[0]["title"] == "coxswain: needs you" and "Approval needed" in notes[0]["body"], notes
    # Usage folds into the status line: no transcript line is a bare event type.
    expect(page.locator("#turn-status .turn-tokens")).to_contain_text("tokens")
    assert page.locator(".item.note", has_text=re.compile(r"^\s*usage\s*$")).count() == 0
    no_serious_axe(page)
    shot(page, "needs-you")

    page.keyboard.press("Enter")  # Allow, from the focused button
    expect(page.locator(".approval")).to_have_count(0)
    expect(page.locator("#draft")).to_be_focused()  # back to the composer after answering
    expect(page.locator(".item.assistant", has_text="done")).to_have_count(1)
    expect(page).to_have_title(re.compile(r"^(?!\(\d+\) Needs you).* · coxswain$"))
    expect(page.locator("#favicon")).to_have_attribute("data-count", "0")
    expect(link).not_to_have_attribute("data-state", "needs")
    assert (up.root / "needs" / "build").is_dir()
    notes_text = " ".join(page.locator(".item.note").all_inner_texts())
    assert "usage" not in notes_text and "version.kept" not in notes_text, notes_text

    # Another session that starts waiting (seen by the list's poll) counts too, and notifies.
    with up.client() as api:
        other = api.create("needs-other", create=True)
        assert api.send(other["id"], said("Elsewhere", {"tools": [tool("run_command", command="touch x")]})).status_code in (200, 201, 202)
        api.wait_type(other["id"], "approval.pending")
        elsewhere = page.locator(f"#sessions a[data-sid='{other['id']}']")
        expect(elsewhere).to_have_attribute("data-state", "needs", timeout=15_000)
        expect(page).to_have_title(re.compile(r"^\(1\) Needs you · "))
        page.wait_for_function("window.__notes.length >= 2")
        assert "waits for your approval" in page.evaluate("window.__notes[1].body")
        aid = api.session(other["id"])["approvals"][0]["approval_id"]
        r = api.http.post(f"/v1/sessions/{other['id']}/approvals/{aid}", json={"decision": "deny"})
        assert r.status_code == 200, r.text
        expect(elsewhere).not_to_have_attribute("data-state", "needs", timeout=15_000)
        expect(page).to_have_title(re.compile(r"^(?!\(\d+\) Needs you)"))


# ---------------------------------------------------------------------------------- item 5
def test_the_keyboard_reaches_every_next_action_without_a_mouse(page: Page, up: CoxUp) -> None:
    """Login, create, send, approve, the shortcut sheet and the inspector's tabs, keys only."""
    page.evaluate("localStorage.clear()")
    page.reload()
    expect(page.locator("#login-token")).to_be_focused()
    page.evaluate("window.__mouse = 0; addEventListener('mousedown', () => window.__mouse++, true)")
    page.keyboard.type(up.token)
    page.keyboard.press("Enter")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#new-workspace")).to_be_focused()  # no session open: the next action is a new one
    page.keyboard.type("keys")
    page.keyboard.press("Tab")  # existing workspaces
    page.keyboard.press("Tab")  # Create a new folder
    page.keyboard.press("Space")
    expect(page.locator("#new-create")).to_be_checked()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator("#draft")).to_be_focused()  # after creating a session: the composer
    page.keyboard.insert_text(said("Touch it", {"tools": [tool("run_command", command="touch k")]}, {"text": "touched"}))
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement && document.activeElement.dataset.act === 'allow'")
    page.keyboard.press("Tab")
    assert active(page)["act"] == "deny"
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    expect(page.locator(".item.assistant", has_text="touched")).to_have_count(1)
    expect(page.locator("#draft")).to_be_focused()  # after the answer: back to the composer

    # "?" (outside a text box) opens the shortcut sheet; Esc closes it and focus comes back.
    page.keyboard.press("Tab")
    was = active(page)["id"]
    page.keyboard.press("?")
    sheet = page.locator("#keys")
    expect(sheet).to_be_visible()
    expect(sheet).to_contain_text("Ctrl")
    expect(page.locator("#keys-close")).to_be_focused()
    no_serious_axe(page)
    shot(page, "keys")
    page.keyboard.press("Escape")
    expect(sheet).to_be_hidden()
    assert active(page)["id"] == was
    page.keyboard.press("/")
    expect(page.locator("#draft")).to_be_focused()
    # The sheet's close event comes a task after it closed, and a browser under load runs key
    # presses first (CI: "/" went to the composer, then the late close event took focus back).
    # A focus moved before that event stays where it was moved.
    page.keyboard.press("Tab")
    page.keyboard.press("?")
    expect(page.locator("#keys-close")).to_be_focused()
    landed = page.evaluate("""async () => {
        document.querySelector('#keys').close();
        document.querySelector('#draft').focus();  // as "/" does, before the close event runs
        await new Promise((r) => setTimeout(r, 50));
        return document.activeElement.id;
    }""")
    assert landed == "draft", f"the late close event moved focus to {landed!r}"

    # Inspector tabs: one in the Tab order, arrows move and show.
    page.focus("#tabbtn-plan")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#tabbtn-changes")).to_be_focused()
    expect(page.locator("#tabbtn-changes")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#tab-changes")).to_be_visible()
    page.keyboard.press("End")
    expect(page.locator("#tabbtn-history")).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(page.locator("#tabbtn-plan")).to_be_focused()
    expect(page.locator("#tab-plan")).to_be_visible()
    assert page.locator(".tabs [role=tab][tabindex='0']").count() == 1
    expect(page.locator("h1")).to_have_count(1)

    # Queue, Lead and Stop by their keys while a slow turn runs.
    page.keyboard.press("/")
    # long (a Stop ends it at once), so the keys below land while it runs on a loaded machine
    page.keyboard.insert_text(said("Slow", {"text": "step", "delay_ms": 30_000}, {"text": "slow done"}))
    page.keyboard.press("Enter")
    expect(page.locator("#state")).to_have_text("working")
    page.keyboard.insert_text("queued by keys")
    page.keyboard.press("Control+o")
    expect(page.locator("#outbox-list li", has_text="queued by keys")).to_have_count(1)
    page.keyboard.insert_text("lead by keys")
    page.keyboard.press("Control+l")
    expect(page.locator("#outbox-list li", has_text="lead by keys")).to_have_count(1)
    page.keyboard.press("Escape")
    expect(page.locator(".item.note", has_text="Turn ended: stopped")).to_have_count(1)
    expect(page.locator("#state")).to_have_text("idle")

    # Review (R, outside a text box), then Rewind from a turn's end, by keys.
    page.keyboard.press("Tab")
    page.keyboard.press("r")
    expect(page.locator("#review-title")).to_have_text("Review: what this session changed")
    expect(page.locator("#review .review-file[data-path='k'] .via-badge")).to_have_text("created")
    page.keyboard.press("Escape")
    expect(page.locator("#review")).to_be_hidden()
    page.focus("[data-turn-act=rewind][data-turn='1']")
    page.keyboard.press("Enter")
    expect(page.locator("#rewind-cancel")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.dataset.scope") == "conversation"
    page.keyboard.press("Enter")
    expect(page.locator(".item.note.rewound")).to_contain_text("Rewound the conversation to the end of turn 1")
    expect(page.locator("#draft")).to_be_focused()
    assert page.evaluate("window.__mouse") == 0, "a mouse event happened in the keyboard-only run"


# ---------------------------------------------------------------------------------- item 6
ANSWER = (
    "Here is the table:\n\n| file | lines |\n| --- | ---: |\n| a.txt | 2 |\n| b.txt | 10 |\n\n"
    "~~~python\nprint('copy me')\n~~~\n"
)


@pytest.mark.parametrize("width", [400], indirect=True)
def test_a_quieter_transcript_on_a_phone(page: Page, up: CoxUp, browser: BrowserContext, width: int) -> None:
    browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=up.url)
    login(page, up)
    create(page, "quiet")
    page.fill("#draft", said("Plan and ask", {"text": "Planning.", "tools": [
        tool("plan_write", steps=["look", "touch"]), tool("plan_step", step=1),
        tool("run_command", command="touch nope")]}, {"text": ANSWER}))
    page.click("#btn-send")
    expect(page.locator(".approval")).to_be_visible()
    # Plan bookkeeping is one line per call, no tool card.
    lines = page.locator(".item.plan-line")
    expect(lines).to_have_count(2)
    expect(lines.nth(0)).to_have_text("Plan: 2 steps — look; touch")
    expect(lines.nth(1)).to_have_text("✓ Plan step 1 done: look")
    assert page.locator(".item.tool .name", has_text="plan_").count() == 0

    # Touch targets: every button in the composer and on the approval card is at least 44 px high.
    heights = page.evaluate("() => [...document.querySelectorAll('#composer button, .approval button')]"
                            ".filter(b => b.offsetParent).map(b => [b.textContent, b.getBoundingClientRect().height])")
    assert heights and all(hh >= 44 for _, hh in heights), heights

    # Queue two; the position said is gone once the queue is reordered.
    for text in ("q one", "q two"):
        page.fill("#draft", text)
        page.click("#btn-queue")
        expect(page.locator("#outbox-list li", has_text=text)).to_have_count(1)
    expect(page.locator("#composer-note")).to_contain_text("Queued (position 2)")
    page.locator("#outbox-list li", has_text="q two").locator("[data-act=up]").click()
    expect(page.locator("#outbox-list li").first).to_contain_text("q two")
    expect(page.locator("#composer-note")).to_have_text("")

    # A touch keyboard: Enter is a new line, Send is the button.
    cdp = page.context.new_cdp_session(page)
    cdp.send("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 5})
    page.fill("#draft", "two")
    page.locator("#draft").press("End")
    page.locator("#draft").press("Enter")
    page.locator("#draft").type("lines")
    expect(page.locator("#draft")).to_have_value("two\nlines")
    expect(page.locator("#outbox-list li")).to_have_count(2)  # nothing was queued or sent by Enter
    cdp.send("Emulation.setTouchEmulationEnabled", {"enabled": False})
    page.fill("#draft", "")

    # A Deny is said once on its card.
    page.locator(".approval [data-act=deny]").click()
    card = page.locator(".item.tool", has_text="touch nope")
    expect(card.locator(".status")).to_have_text("denied by you")
    expect(page.locator(".item.assistant", has_text="echo: q one")).to_have_count(1)
    expect(page.locator("#state")).to_have_text("idle")
    text = card.inner_text().lower()
    assert text.count("denied") == 1 and "refuse by person" not in text and "deny" not in text, text

    # Settled messages fold into one line: the transcript already shows them.
    expect(page.locator("#outbox-list li")).to_have_count(0)
    expect(page.locator("#outbox-settled summary")).to_have_text("2 settled — each is in the transcript")
    assert page.locator("#outbox").bounding_box()["height"] < 90  # type: ignore[index]

    # Markdown tables, and a Copy button on code.
    answer = page.locator(".item.assistant", has_text="Here is the table")
    expect(answer.locator("table th")).to_have_text(["file", "lines"])
    expect(answer.locator("table tbody tr")).to_have_count(2)
    expect(answer.locator("table tbody tr").nth(1).locator("td").nth(1)).to_have_css("text-align", "right")
    copy = answer.locator("pre.code button.copy")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "print('copy me')"
    no_serious_axe(page)
    shot(page, "quiet")


# ---------------------------------------------------------------------------------- item 2
def two_turns_of_changes(page: Page, up: CoxUp, workspace: str) -> tuple[str, Path]:
    """Turn 1 creates a.txt (a write) and b.txt (a command); turn 2 edits a.txt and deletes b.txt."""
    sid = create(page, workspace)
    with up.client() as api:
        assert api.http.patch(f"/v1/sessions/{sid}", json={"dont_ask": True}).status_code == 200
    page.fill("#draft", said("Make two files", {"tools": [
        tool("write_file", path="a.txt", content="one\ntwo\n"),
        tool("run_command", command="printf 'made\\n' > b.txt")]}, {"text": "made"}))
    page.click("#btn-send")
    expect(page.locator(".item.note.turn-end")).to_have_count(1)
    page.fill("#draft", said("Edit and delete", {"tools": [
        tool("edit_file", path="a.txt", old="two", new="TWO"),
        tool("run_command", command="rm b.txt")]}, {"text": "edited"}))
    page.click("#btn-send")
    expect(page.locator(".item.note.turn-end")).to_have_count(2)
    expect(page.locator("#state")).to_have_text("idle")
    ws = up.root / workspace
    assert (ws / "a.txt").read_text() == "one\nTWO\n" and not (ws / "b.txt").exists()
    return sid, ws


@pytest.mark.parametrize("width", [1400, 400], indirect=True)
def test_review_inline_diffs_and_the_net_diff_of_a_session_and_a_turn(page: Page, up: CoxUp, width: int) -> None:
    login(page, up)
    _sid, ws = two_turns_of_changes(page, up, f"review-{width}")

    # Each write or command card says what it did to each file, its diff folded under it.
    write = page.locator(".item.tool", has_text="write_file").locator("details.file-change")
    expect(write.locator("summary")).to_have_text("Created a.txt +2 −0")
    write.locator("summary").click()
    expect(write.locator(".diff .ln.add")).to_have_count(2)
    edit = page.locator(".item.tool", has_text="edit_file")
    expect(edit.locator(".args")).to_have_text("a.txt")  # not the raw JSON of its arguments
    edit.locator("details.file-change summary").click()
    expect(edit.locator(".diff .ln.del")).to_contain_text("two")
    expect(edit.locator(".diff .ln.add")).to_contain_text("TWO")
    made = page.locator(".item.tool", has_text="> b.txt").locator("details.file-change")
    expect(made.locator("summary")).to_contain_text("Created b.txt")
    gone = page.locator(".item.tool", has_text="rm b.txt").locator("details.file-change")
    expect(gone.locator("summary")).to_have_text("Deleted b.txt")
    gone.locator("summary").click()
    expect(gone).to_contain_text("b.txt no longer exists")

    # The session's Review: every file it changed, from before the session to now.
    page.click("#btn-review")
    dialog = page.locator("#review")
    expect(dialog).to_be_visible()
    expect(page.locator("#review-title")).to_have_text("Review: what this session changed")
    a = dialog.locator(".review-file[data-path='a.txt']")
    expect(a.locator(".via-badge")).to_have_text("created")
    expect(a.locator(".counts")).to_have_text("+2 −0")
    expect(dialog.locator(".review-file[data-path='b.txt'] .via-badge")).to_have_text("created, then deleted")
    no_serious_axe(page)
    shot(page, "review-session")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    # Turn 2's Review: a.txt changed +1 -1, b.txt deleted; Restore, then Undo, from there.
    page.locator("[data-turn-act=review][data-turn='2']").click()
    expect(page.locator("#review-title")).to_have_text("Review: what turn 2 changed")
    a = dialog.locator(".review-file[data-path='a.txt']")
    expect(a.locator(".via-badge")).to_have_text("changed")
    expect(a.locator(".counts")).to_have_text("+1 −1")
    b = dialog.locator(".review-file[data-path='b.txt']")
    expect(b.locator(".via-badge")).to_have_text("deleted")
    expect(b).to_contain_text("Deleted: b.txt no longer exists")
    shot(page, "review-turn")
    a.locator("[data-act=restore]").click()
    expect(page.locator("#review-result")).to_contain_text("Restored a.txt as it was before")
    assert (ws / "a.txt").read_text() == "one\ntwo\n"
    expect(dialog.locator(".review-file[data-path='a.txt'] .via-badge")).to_have_text("unchanged now")
    expect(page.locator("#review-undo")).to_contain_text("put back a.txt as it was before")
    page.click("#review-undo-btn")
    expect(page.locator("#review-result")).to_contain_text("Undid the latest write")
    assert (ws / "a.txt").read_text() == "one\nTWO\n"
    if width >= 1000:
        page.keyboard.press("Escape")
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press("r")  # R opens the session's Review
        expect(page.locator("#review-title")).to_have_text("Review: what this session changed")
    page.click("#review-close")
    expect(dialog).to_be_hidden()


# ---------------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("width", [1400, 400], indirect=True)
def test_the_rewind_dialog_previews_and_rewound_turns_stay_dimmed(page: Page, up: CoxUp, width: int) -> None:
    login(page, up)
    sid = create(page, f"rewind-{width}")
    with up.client() as api:
        assert api.http.patch(f"/v1/sessions/{sid}", json={"dont_ask": True}).status_code == 200
    turns = [("first", [tool("write_file", path="f.txt", content="first\n")]),
             ("second", [tool("write_file", path="f.txt", content="second\n"), tool("write_file", path="g.txt", content="new\n")]),
             ("third", [])]
    for n, (text, tools) in enumerate(turns, start=1):
        page.fill("#draft", said(text, {"tools": tools}, {"text": f"ok {n}"}) if tools else text)
        page.click("#btn-send")
        expect(page.locator(".item.note.turn-end")).to_have_count(n)
        expect(page.locator("#state")).to_have_text("idle")
    ws = up.root / f"rewind-{width}"

    page.locator("[data-turn-act=rewind][data-turn='1']").click()
    dialog = page.locator("#rewind")
    expect(dialog).to_be_visible()
    expect(page.locator("#rewind-title")).to_have_text("Rewind to the end of turn 1")
    expect(page.locator("#rewind-cancel")).to_be_focused()  # the safe default: nothing happens on Enter
    expect(page.locator("#rewind-files li[data-path='f.txt']")).to_contain_text("put back as it was at the end of turn 1")
    expect(page.locator("#rewind-files li[data-path='g.txt']")).to_contain_text("deleted (created after this turn)")
    expect(page.locator("#rewind-turns li")).to_have_count(2)
    expect(page.locator("#rewind-turns li").nth(0)).to_contain_text("Turn 2: “second”")
    expect(page.locator("#rewind-turns li").nth(1)).to_contain_text("Turn 3: “third”")
    expect(dialog.locator("[data-scope]")).to_have_text(["Conversation only", "Files only", "Both"])
    no_serious_axe(page)
    shot(page, "rewind-dialog")
    dialog.locator("[data-scope=both]").click()
    expect(dialog).to_be_hidden()
    expect(page.locator(".item.note.rewound")).to_contain_text("Rewound the conversation and the files to the end of turn 1")
    assert (ws / "f.txt").read_text() == "first\n" and not (ws / "g.txt").exists()

    def dimmed() -> tuple[int, int, list[str]]:
        out = page.evaluate("""() => {
          const items = [...document.querySelectorAll('#transcript .item')];
          const users = items.filter(e => e.classList.contains('user'));
          return [items.filter(e => e.classList.contains('rewound-out')).length,
                  users.filter(e => !e.classList.contains('rewound-out')).length,
                  users.filter(e => e.classList.contains('rewound-out')).map(e => e.lastChild.textContent.split('\\n')[0])];
        }""")
        return out[0], out[1], out[2]

    n_dim, n_kept, dim_users = dimmed()
    assert dim_users == ["second", "third"] and n_kept == 1 and n_dim >= 6, (n_dim, n_kept, dim_users)
    expect(page.locator(".item.note.turn-start.rewound-out .rewound-mark")).to_have_count(2)
    no_serious_axe(page)
    shot(page, "rewound")
    page.reload()
    expect(page.locator("#stream")).to_have_text("live")
    assert dimmed()[2] == ["second", "third"], "after a reload the rewound turns are still marked"
