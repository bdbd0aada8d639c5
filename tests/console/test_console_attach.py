"""Attachments and programs in the web console (issue 25), in headless Chromium against a real
``cox up`` (docs/api.md: Attachments, Programs).

- Files are attached by the Attach button (the file picker), pasted into the message box and
  dropped on the transcript; each shows as a chip, uploaded at once, removable by keyboard. The
  send carries their ids (read back from the log), and the transcript previews the image from a
  blob the page fetched with the token (never a URL holding it) and names the text file.
- A refusal loses nothing: a file over ``[attachments] max_mb`` and a type not allowed stay as
  failed chips that say why and hold the send back, a Lead with an attachment (409
  ``lead_text_only``) and an image for a model without vision (409 ``not_accepting``) keep the
  text and the chips.
- The inspector lists a program a scripted turn started (name, command, state, its output tail,
  polled while shown); its Stop stops it (``program.stopped`` by ``person``), and Stop of a turn
  offers "Stop programs too" (``{programs: true}``: ``program.stopped`` by ``stop``).

axe-core runs with chips, previews and programs on the page.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.test_console import browser, page, shot
from tests.support.browser import login, new_session, no_serious_axe, pytestmark
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import Api, script

try:
    from playwright.sync_api import FilePayload, Page, expect
except ImportError:  # pragma: no cover - the marks skip the module then
    pass

__all__ = ["browser", "page", "pytestmark"]  # the fixtures of test_console.py, with this module's up

MAX_BYTES = 51_200  # [attachments] max_mb = 0.048828125 (50 KiB)
CONFIG = f"""
[attachments]
max_mb = {MAX_BYTES / 1024 / 1024}
allowed_types = ["image/*", "text/*"]

[approval]
commands = "allow"

# A model without vision (never called: the send is refused before any turn).
[[model.providers]]
name = "text-only"
kind = "openai"
model = "never-called"
base_url = "http://127.0.0.1:9/v1"
api_key = "unused"
"""
# A 2x2 PNG (red), so the preview has a size to check.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg==")

# Files put on a DataTransfer in the page, then a paste into the box or a drop on a zone.
SYNTHETIC = """([kind, target, files]) => {
  const dt = new DataTransfer();
  for (const f of files) {
    const bytes = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
    dt.items.add(new File([bytes], f.name, { type: f.type }));
  }
  const el = document.querySelector(target);
  const ev = kind === "paste"
    ? new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true })
    : new DragEvent(kind, { dataTransfer: dt, bubbles: true, cancelable: true });
  el.dispatchEvent(ev);
  return ev.defaultPrevented;
}"""


def file(name: str, mime: str, data: bytes) -> FilePayload:
    return {"name": name, "mimeType": mime, "buffer": data}


def start_program(command: str, name: str) -> dict[str, Any]:
    """A ``start_program`` call of a script step (``tool()`` takes ``name`` for the tool's own)."""
    return {"name": "start_program", "args": {"command": command, "name": name}}


def put(page: Page, kind: str, target: str, *files: tuple[str, str, bytes]) -> bool:
    """Paste (``kind="paste"``) or drop (``"dragenter"``, ``"dragover"``, ``"drop"``) files on ``target``."""
    payload = [{"name": n, "type": t, "b64": base64.b64encode(b).decode()} for n, t, b in files]
    return bool(page.evaluate(SYNTHETIC, [kind, target, payload]))


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("console-attach"), CONFIG) as u:
        yield u


@pytest.fixture
def api(up: CoxUp) -> Iterator[Api]:
    with up.client() as a:
        yield a


def chip(page: Page, name: str) -> Any:
    return page.locator("#attach-list li").filter(has=page.locator(".chip-name", has_text=re.compile(f"^{re.escape(name)}$")))


def user_msgs(api: Api, sid: str) -> list[dict[str, Any]]:
    return [e for e in api.all_events(sid) if e["type"] == "user.msg"]


def test_attach_by_button_paste_and_drop_then_the_send_carries_them_and_shows_them(page: Page, up: CoxUp, api: Api) -> None:
    login(page, up)
    sid = new_session(page, "attach-send")

    # The button opens the file picker (Playwright answers it); the chip says uploading, then ready.
    with page.expect_file_chooser() as fc:
        page.click("#btn-attach")
    fc.value.set_files(files=[file("notes.txt", "text/plain", b"the build needs make 4.3\n")])
    expect(chip(page, "notes.txt")).to_have_attribute("data-state", "ready")
    expect(chip(page, "notes.txt").locator(".chip-size")).to_have_text("25 B")
    # The hidden input itself, as set_input_files fills it: a second file.
    page.set_input_files("#attach-input", files=[file("extra.txt", "text/plain", b"extra\n")])
    expect(chip(page, "extra.txt")).to_have_attribute("data-state", "ready")

    # A pasted image (a clipboard's file is named "image.png"): attached under a name of its own;
    # the paste of a file alone puts nothing in the box.
    page.fill("#draft", "Look at these")
    assert put(page, "paste", "#draft", ("image.png", "image/png", PNG)) is True
    pasted = page.locator("#attach-list li").filter(has=page.locator(".chip-name", has_text=re.compile(r"^pasted-\d+\.png$")))
    expect(pasted).to_have_attribute("data-state", "ready")
    expect(page.locator("#draft")).to_have_value("Look at these")

    # A file dropped on the transcript: the zone lights up while dragged over, takes the drop.
    put(page, "dragenter", "#transcript", ("dropped.txt", "text/plain", b"dropped\n"))
    expect(page.locator("#transcript")).to_have_class(re.compile(r"\bdropping\b"))
    assert put(page, "dragover", "#transcript", ("dropped.txt", "text/plain", b"dropped\n")) is True
    assert put(page, "drop", "#transcript", ("dropped.txt", "text/plain", b"dropped\n")) is True
    expect(page.locator("#transcript")).not_to_have_class(re.compile(r"\bdropping\b"))
    expect(chip(page, "dropped.txt")).to_have_attribute("data-state", "ready")
    expect(page.locator("#attach-list li")).to_have_count(4)
    no_serious_axe(page)
    shot(page, "attach-chips")

    # Removed by keyboard: its ✕ has a name, Enter removes it, the focus goes to the next chip.
    chip(page, "extra.txt").get_by_role("button", name="Remove extra.txt").focus()
    page.keyboard.press("Enter")
    expect(chip(page, "extra.txt")).to_have_count(0)
    expect(pasted.locator("button.remove")).to_be_focused()
    ids = page.locator("#attach-list li").evaluate_all("els => els.map(e => e.dataset.attachment)")
    assert len(ids) == 3 and all(ids), ids

    page.focus("#draft")
    page.press("#draft", "Enter")
    expect(page.locator("#attach-list")).to_be_hidden()
    expect(page.locator("#draft")).to_have_value("")
    msg = page.locator(".item.user").filter(has_text="Look at these")
    expect(msg).to_have_count(1)
    # The image is previewed from a blob the page fetched with the token; the others are chips.
    fig = msg.locator("figure.attach-img")
    expect(fig).to_have_attribute("data-loaded", "1")
    src = fig.locator("img").get_attribute("src") or ""
    assert src.startswith("blob:"), src
    assert up.token not in src
    assert fig.locator("img").evaluate("img => img.complete && img.naturalWidth") == 2
    expect(msg.locator("button.chip.file")).to_have_count(2)
    expect(msg.locator("button.chip.file").filter(has_text="notes.txt")).to_contain_text("25 B")
    # The text stays the message's own last line.
    assert msg.evaluate("e => e.lastChild.textContent") == "Look at these"

    # The send carried the ids, in the order attached; the log names each one.
    sent = user_msgs(api, sid)
    assert len(sent) == 1, sent
    assert [a["attachment_id"] for a in sent[0]["attachments"]] == ids
    assert sent[0]["attachments"][0]["name"] == "notes.txt"
    assert sent[0]["attachments"][1]["media_type"] == "image/png"
    no_serious_axe(page)
    shot(page, "attach-sent")

    # A reload draws the same from the log (a fresh blob, fetched again with the token).
    page.reload()
    msg = page.locator(".item.user").filter(has_text="Look at these")
    expect(msg.locator("figure.attach-img")).to_have_attribute("data-loaded", "1")
    expect(page.locator("#state")).to_have_text("idle")


def test_a_refused_attachment_or_send_loses_neither_the_text_nor_the_chips(page: Page, up: CoxUp, api: Api) -> None:
    login(page, up)
    sid = new_session(page, "attach-refused")

    # Over [attachments] max_mb: a failed chip saying so, and the send is held back.
    page.fill("#draft", "Here is the big log")
    page.set_input_files("#attach-input", files=[file("big.log", "text/plain", b"x" * (MAX_BYTES + 1))])
    big = chip(page, "big.log")
    expect(big).to_have_attribute("data-state", "failed")
    expect(big.locator(".chip-state")).to_contain_text("too large")
    expect(big.locator(".chip-state")).to_contain_text(str(MAX_BYTES))
    expect(page.locator("#composer-note")).to_contain_text("big.log was not attached")
    # A type not allowed ([attachments] allowed_types): failed too, saying why.
    page.set_input_files("#attach-input", files=[file("a.zip", "application/zip", b"PK\x03\x04")])
    expect(chip(page, "a.zip")).to_have_attribute("data-state", "failed")
    expect(chip(page, "a.zip").locator(".chip-state")).to_contain_text("type not allowed")
    expect(chip(page, "a.zip").locator(".chip-state")).to_contain_text("application/zip")
    no_serious_axe(page)
    page.press("#draft", "Enter")
    expect(page.locator("#composer-note")).to_contain_text("Remove them (✕) to send without them")
    expect(page.locator("#draft")).to_have_value("Here is the big log")
    assert user_msgs(api, sid) == [], "nothing may be sent while an attachment failed"
    shot(page, "attach-refused")
    chip(page, "big.log").get_by_role("button", name="Remove big.log").click()
    chip(page, "a.zip").get_by_role("button", name="Remove a.zip").click()
    expect(page.locator("#attach-list")).to_be_hidden()

    # A Lead carries text only (409 lead_text_only): the text and the chip stay.
    page.fill("#draft", script({"text": "Working slowly.", "delay_ms": 60_000}))
    page.press("#draft", "Enter")
    expect(page.locator("#state")).to_have_text("working")
    page.fill("#draft", "also read this")
    page.set_input_files("#attach-input", files=[file("lead.txt", "text/plain", b"lead\n")])
    expect(chip(page, "lead.txt")).to_have_attribute("data-state", "ready")
    page.click("#btn-lead")
    expect(page.locator("#composer-note")).to_contain_text("A Lead carries text only")
    expect(page.locator("#draft")).to_have_value("also read this")
    expect(chip(page, "lead.txt")).to_have_attribute("data-state", "ready")
    # Queued with it instead: accepted, and the chip goes with the message.
    page.click("#btn-queue")
    expect(page.locator("#attach-list")).to_be_hidden()
    page.click("#btn-stop")
    expect(page.locator("#state")).to_have_text("idle")
    queued = [e for e in api.all_events(sid) if e["type"] == "queue.added"]
    assert len(queued) == 1, queued

    # An image for a model without vision (409 not_accepting): said plainly, nothing lost.
    page.select_option("#model", "text-only")
    expect(page.locator("#model")).to_have_value("text-only")
    page.fill("#draft", "What is in this picture?")
    assert put(page, "paste", "#draft", ("shot.png", "image/png", PNG)) is True
    expect(chip(page, "shot.png")).to_have_attribute("data-state", "ready")
    before = len(user_msgs(api, sid))
    page.press("#draft", "Enter")
    note = page.locator("#composer-note")
    expect(note).to_contain_text("Not sent")
    expect(note).to_contain_text("text-only")
    expect(note).to_contain_text("Your text and attachments are still here")
    expect(page.locator("#draft")).to_have_value("What is in this picture?")
    expect(chip(page, "shot.png")).to_have_attribute("data-state", "ready")
    assert len(user_msgs(api, sid)) == before


TICKER = "i=0; while true; do i=$((i+1)); echo \"tick $i\"; sleep 0.2; done"


def test_the_inspector_lists_a_program_shows_its_output_and_stops_it(page: Page, up: CoxUp, api: Api) -> None:
    login(page, up)
    sid = new_session(page, "attach-programs")
    page.fill("#draft", script({"text": "Starting it.", "tools": [start_program(TICKER, "ticker")]},
                               {"text": "It runs."}))
    page.press("#draft", "Enter")
    started = api.wait_type(sid, "program.started", timeout=30)
    pid = started["program_id"]
    row = page.locator(f"#programs li[data-program='{pid}']")
    expect(row).to_be_visible()
    expect(row.locator(".name")).to_have_text("ticker")
    expect(row.locator(".command")).to_contain_text("echo \"tick $i\"")
    expect(row.locator(".state")).to_have_text("running")
    expect(row.locator(".meta")).to_contain_text("started by the model")
    expect(page.locator("#state")).to_have_text("idle")
    # Its output tail, polled while the inspector shows it: it moves on.
    expect(row.locator("pre.tail")).to_contain_text("tick 3", timeout=30_000)
    first = row.locator("pre.tail").text_content() or ""
    expect(row.locator("pre.tail")).not_to_have_text(first, timeout=30_000)
    no_serious_axe(page)
    shot(page, "programs")

    # A reload lists it again from the session object.
    page.reload()
    row = page.locator(f"#programs li[data-program='{pid}']")
    expect(row.locator(".state")).to_have_text("running")
    expect(row.locator("pre.tail")).to_contain_text("tick")

    # Its Stop (by keyboard): the runner stops it, recorded as the person's.
    row.get_by_role("button", name="Stop program ticker").focus()
    page.keyboard.press("Enter")
    stopped = api.wait_type(sid, "program.stopped", timeout=30, program_id=pid)
    assert stopped["by"] == "person", stopped
    expect(row.locator(".state")).to_have_text("stopped (by person)")
    expect(row.get_by_role("button", name="Stop program ticker")).to_be_hidden()
    expect(row.locator("pre.tail")).to_be_focused()
    assert api.session(sid)["programs"] == []
    expect(page.locator("#stop-programs-wrap")).to_be_hidden()

    # Stop of a turn while a program runs offers to stop it too ({programs: true}).
    page.fill("#draft", script({"text": "Another.", "tools": [start_program(TICKER, "second")]},
                               {"text": "Working slowly.", "delay_ms": 60_000}))
    page.press("#draft", "Enter")
    second = api.wait_type(sid, "program.started", timeout=30, name="second")["program_id"]
    wrap = page.locator("#stop-programs-wrap")
    expect(wrap).to_be_visible()
    expect(wrap).to_contain_text("Stop programs too (1 running)")
    page.check("#stop-programs")
    page.click("#btn-stop")
    ended = api.wait_type(sid, "program.stopped", timeout=30, program_id=second)
    assert ended["by"] == "stop", ended
    expect(page.locator(f"#programs li[data-program='{second}'] .state")).to_have_text("stopped (by stop)")
    expect(page.locator("#composer-note")).to_contain_text("its programs stopped too")
    expect(page.locator("#state")).to_have_text("idle")
    expect(wrap).to_be_hidden()
    turn_ends = [e["outcome"] for e in api.all_events(sid) if e["type"] == "turn.end"]
    assert turn_ends == ["completed", "stopped"], turn_ends
    assert json.dumps(api.session(sid)["programs"]) == "[]"
