"""``cox chat``, the terminal client, driven by Textual's headless pilot against a real
``cox up``: every steering action by its key, approvals answered inline, /versions, /undo,
/title, and assertions on what the screen shows. Screenshots (SVG) go to ``tests/artifacts/``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Static

from cox.chat_app import ChatApp
from cox.chat_client import ChatApi
from tests.support import ARTIFACTS
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import said, tool


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("chat")) as u:
        yield u


def shown(app: App[Any], selector: str = "Static") -> str:
    """The text the screen shows in these widgets."""
    return "\n".join(str(w.content) for w in app.query(selector).results(Static))


async def until(pilot: Pilot[Any], cond: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"not shown within {timeout}s: {what}\n---- screen\n{shown(pilot.app)}")


async def paste(pilot: Pilot[Any], text: str) -> None:
    """Put text in the composer as a paste would (a key per character is slow for scripts)."""
    app = pilot.app
    assert isinstance(app, ChatApp)
    app.draft.value = text
    await pilot.pause()


def save(app: ChatApp, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    app.save_screenshot(filename=f"chat-{name}.svg", path=str(ARTIFACTS))


async def test_a_person_steers_a_turn_from_the_terminal(up: CoxUp) -> None:
    app = ChatApp(ChatApi(up.url, up.token), None, workspace="tui")
    async with app.run_test(size=(140, 48)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        assert "untitled" in shown(app, "#head") and "idle" in shown(app, "#head")
        assert app.m is not None
        sid = app.m.sid

        # Enter sends: a plan, a write, then a command the rules judge refuses -> the person.
        first = said("Write the notes", {
            "text": "Planning the notes.",
            "tools": [tool("plan_write", steps=["write the notes", "check them"]), tool("plan_step", step=1),
                      tool("write_file", path="notes.txt", content="first draft\n"),
                      tool("run_command", command="touch checked"), tool("write_file", path="later.txt", content="x")],
        }, {"text": "Checked."})
        await paste(pilot, first)
        await pilot.press("enter")
        await until(pilot, lambda: "APPROVAL NEEDED" in shown(app, "#approvals"), "the approval prompt")
        approvals = shown(app, "#approvals")
        assert "touch checked" in approvals and "judge (rules) said refuse" in approvals
        assert app.draft.value == ""
        assert "working" in shown(app, "#head")
        await until(pilot, lambda: "1. ✓ write the notes" in shown(app, "#plan"), "the plan with its mark")
        assert "model: Planning the notes." in shown(app, "#transcript Static")

        # While the turn runs, Enter is refused and the text stays (typed key by key).
        await pilot.press(*"plain")
        await pilot.press("enter")
        assert "Enter is refused" in shown(app, "#note")
        assert app.draft.value == "plain"

        # Ctrl+O queues two.
        q1 = said("first queued", {"tools": [tool("run_command", command="touch second")]}, {"text": "never"})
        await paste(pilot, q1)
        await pilot.press("ctrl+o")
        await paste(pilot, "second queued")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: shown(app, "#outbox").count("[queued] Queue") == 2, "two queued")
        assert "Queued (position 2)" in shown(app, "#note")

        # A Lead too large to save keeps the draft; Ctrl+L saves one.
        big = "y" * (33 * 1024)
        await paste(pilot, big)
        await pilot.press("ctrl+l")
        assert "Lead not saved" in shown(app, "#note")
        assert app.draft.value == big
        lead = said("Lead: rewrite the notes", {"tools": [tool("write_file", path="notes.txt", content="second draft\n")]},
                      {"text": "Lead applied."})
        await paste(pilot, lead)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: "[pending] Lead: Lead: rewrite the notes" in shown(app, "#outbox"), "the Lead waits")
        save(app, "mid-turn")

        # Answer inline with a message: /allow MESSAGE.
        await paste(pilot, "/allow augment: note the check")
        await pilot.press("enter")
        await until(pilot, lambda: "you (with the approval): augment: note the check" in shown(app, "#transcript Static"),
                    "the approval's message as a user message")
        await until(pilot, lambda: "[applied] Lead" in shown(app, "#outbox"), "the Lead applied")
        assert "Allowed by person — “augment: note the check”" in shown(app, "#transcript Static")
        assert "later.txt (1 chars)  [skipped (lead)]" in shown(app, "#transcript Static")
        await until(pilot, lambda: "model: Lead applied." in shown(app, "#transcript Static"), "the Lead's answer")

        # The first queued message runs and waits for its approval; Ctrl+S steers past it.
        await until(pilot, lambda: "touch second" in shown(app, "#approvals"), "the queued turn's approval")
        await paste(pilot, "steer: another way")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "Turn ended: stopped" in shown(app, "#transcript Static"), "the steered turn stops")
        await until(pilot, lambda: "[applied] Steer: steer: another way" in shown(app, "#outbox"), "the steer applied")
        await until(pilot, lambda: "model: echo: second queued" in shown(app, "#transcript Static"), "the second queued ran")
        await until(pilot, lambda: "idle" in shown(app, "#head"), "idle again")
        outbox = shown(app, "#outbox")
        assert outbox.count("[applied] Queue") == 2, outbox
        assert shown(app, "#approvals") == ""
        users = [str(w.content) for w in app.query(".user").results(Static)]
        assert [u.splitlines()[0] for u in users] == [
            "you: Write the notes", "you (with the approval): augment: note the check",
            "you (Lead): Lead: rewrite the notes", "you (queued): first queued", "you (steered): steer: another way",
            "you (queued): second queued"], users

        # /versions PATH, /undo, /title NEW.
        ws = up.root / "tui"
        assert (ws / "notes.txt").read_text() == "second draft\n"
        await paste(pilot, "/versions notes.txt")
        await pilot.press("enter")
        await until(pilot, lambda: "Kept versions of notes.txt (newest first):" in shown(app, "#transcript Static"),
                    "the versions")
        listing = next(str(w.content) for w in app.query(".system").results(Static) if "Kept versions" in str(w.content))
        assert len(listing.splitlines()) >= 3 and "write" in listing
        await paste(pilot, "/undo")
        await pilot.press("enter")
        await until(pilot, lambda: "Undid the latest write: notes.txt put back" in shown(app, "#transcript Static"),
                    "undo answered")
        assert (ws / "notes.txt").read_text() == "first draft\n"
        await paste(pilot, "/title Terminal checks")
        await pilot.press("enter")
        await until(pilot, lambda: "Terminal checks (renamed)" in shown(app, "#head"), "the new title")
        save(app, "after-steer")
        assert app.m.seen == list(range(1, len(app.m.seen) + 1)), "every event once, in order"
    with up.client() as api:
        assert api.session(sid)["title"] == "Terminal checks"


async def test_stop_security_confirm_and_a_refused_lead_in_the_terminal(up: CoxUp) -> None:
    with up.client() as api:
        sid = api.create("tui-stop")["id"]
    app = ChatApp(ChatApi(up.url, up.token), sid)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        # No turn: a Lead is refused and the text stays.
        await paste(pilot, "nothing to join")
        await pilot.press("ctrl+l")
        assert "No turn is running" in shown(app, "#note")
        assert app.draft.value == "nothing to join"

        await paste(pilot, said("Edit the Makefile", {"tools": [
            tool("plan_write", steps=["edit the Makefile", "run make"]), tool("plan_step", step=1),
            tool("write_file", path="Makefile", content="all:\n")]}))
        await pilot.press("enter")
        await until(pilot, lambda: "SECURITY CONFIRM" in shown(app, "#approvals"), "the security confirm")
        assert "/always" not in shown(app, "#approvals"), "no standing answer for a security confirm"
        await paste(pilot, "to be discarded")
        await pilot.press("ctrl+o")
        await paste(pilot, "a Lead never applied")
        await pilot.press("ctrl+l")
        await until(pilot, lambda: "[pending] Lead" in shown(app, "#outbox"), "the Lead saved")
        save(app, "before-stop")
        await pilot.press("escape")
        await until(pilot, lambda: "[discarded] Queue: to be discarded" in shown(app, "#outbox"), "the queue discarded")
        await until(pilot, lambda: "[unapplied] Lead: a Lead never applied" in shown(app, "#outbox"), "the Lead unapplied")
        assert "1 queued discarded" in shown(app, "#note")
        await until(pilot, lambda: "idle" in shown(app, "#head"), "idle")
        assert shown(app, "#approvals") == ""
        assert not (up.root / "tui-stop" / "Makefile").exists()
        save(app, "after-stop")

        # Ctrl+Y answers with the typed text: here a deny with a redirect message.
        await paste(pilot, said("Touch", {"tools": [tool("run_command", command="touch x")]}, {"text": "after"}))
        await pilot.press("enter")
        await until(pilot, lambda: "touch x" in shown(app, "#approvals"), "the approval")
        # The stopped turn's plan was carried into this one, with its mark.
        assert "Plan (carried from an unfinished turn): 1. ✓ edit the Makefile  2. run make" in shown(app, "#plan")
        await paste(pilot, "no: leave it")
        await pilot.press("ctrl+n")
        assert "Press Ctrl+N again to DENY run_command: touch x with “no: leave it”" in shown(app, "#note")
        await pilot.pause(0.5)
        assert "touch x" in shown(app, "#approvals"), "one key press in the text box answered the approval"
        await pilot.press("ctrl+n")
        await until(pilot, lambda: "Denied by person — “no: leave it”" in shown(app, "#transcript Static"), "denied")
        assert "[denied by you]" in shown(app, "#transcript Static")
        await until(pilot, lambda: "idle" in shown(app, "#head"), "idle")
        assert not (up.root / "tui-stop" / "x").exists()


def test_cox_chat_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cox", "chat"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2
    assert "no token" in r.stderr


async def test_chat_keys_need_a_second_press_status_line_queue_list_and_discarded_texts(up: CoxUp) -> None:
    with up.client() as api:
        sid = api.create("tui-queue")["id"]
    app = ChatApp(ChatApi(up.url, up.token), sid)
    async with app.run_test(size=(160, 44)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        await paste(pilot, said("Hold", {"text": "holding", "tokens": 321, "tools": [tool("run_command", command="touch held")]}))
        await pilot.press("enter")
        await until(pilot, lambda: "touch held" in shown(app, "#approvals"), "the approval")
        # The status line: what the turn waits for, its tool calls and tokens.
        await until(pilot, lambda: "waiting for: approval" in shown(app, "#head"), "waiting for the approval")
        head = shown(app, "#head")
        assert "1 tool calls" in head and "tokens" in head, head
        # Ctrl+Y once, with "No, don't" typed, does not allow.
        await paste(pilot, "No, don't")
        await pilot.press("ctrl+y")
        await pilot.pause(0.5)
        assert "touch held" in shown(app, "#approvals")
        assert "Press Ctrl+Y again to ALLOW" in shown(app, "#note")
        # The queue list, numbered; /move and /drop record events.
        for text in ("alpha", "beta", "gamma"):
            await paste(pilot, text)
            await pilot.press("ctrl+o")
        await until(pilot, lambda: "#3 [queued] Queue: gamma" in shown(app, "#outbox"), "three numbered")
        await paste(pilot, "/move 3 1")
        await pilot.press("enter")
        await until(pilot, lambda: "#1 [queued] Queue: gamma" in shown(app, "#outbox"), "gamma first")
        await paste(pilot, "/drop 2")
        await pilot.press("enter")
        await until(pilot, lambda: "Removed from the queue before it started: “alpha”" in shown(app, "#transcript Static"),
                    "alpha removed")
        with up.client() as api:
            assert [q["text"] for q in api.session(sid)["queue"]] == ["gamma", "beta"]
        await pilot.press("escape")
        await until(pilot, lambda: "idle" in shown(app, "#head"), "stopped")
        save(app, "queue-status")
    # A fresh client has only the log: the discarded messages are named by their text.
    app2 = ChatApp(ChatApi(up.url, up.token), sid)
    async with app2.run_test(size=(160, 44)) as pilot:
        await until(pilot, lambda: app2.stream_status == "live", "the stream is live")
        assert "Stop discarded 2 queued: “gamma”, “beta”" in shown(app2, "#transcript Static")


async def test_fork_and_rewind_from_the_terminal(up: CoxUp) -> None:
    """/rewind N [scope] and /fork N (docs/api.md, Fork and rewind): the rewind is shown in the
    transcript, and a fork opens in place of the source, its copied turns and the fork note shown."""
    app = ChatApp(ChatApi(up.url, up.token), None, workspace="tui-fork")
    async with app.run_test(size=(140, 48)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        assert app.m is not None
        sid = app.m.sid
        for n, text in enumerate(["first", "second"], start=1):
            await paste(pilot, said(text, {"tools": [tool("write_file", path="f.txt", content=text)]}, {"text": "ok"}))
            await pilot.press("enter")

            def ended(n: int = n) -> bool:
                return f"Turn ended: completed · turn {n}" in shown(app, "#transcript Static")

            await until(pilot, ended, f"turn {n} ends, numbered")
            await until(pilot, lambda: "idle" in shown(app, "#head"), "idle again")

        await paste(pilot, "/rewind 9")
        await pilot.press("enter")
        await until(pilot, lambda: "there is no turn 9" in shown(app, "#note"), "a bad turn refused")
        await paste(pilot, "/rewind 1 files")
        await pilot.press("enter")
        await until(pilot, lambda: "Rewound the files to the end of turn 1 (put back: f.txt)" in
                    shown(app, "#transcript Static"), "the rewind in the transcript")
        assert "Rewound (files) to the end of turn 1" in shown(app, "#note")

        await paste(pilot, "/fork 1")
        await pilot.press("enter")
        await until(pilot, lambda: app.m is not None and app.m.sid != sid, "the fork opens")
        await until(pilot, lambda: f"Forked from {sid} at its turn 1" in shown(app, "#transcript Static"),
                    "the fork note")
        text = shown(app, "#transcript Static")
        assert "first" in text and "second" not in text and f"a fork of {sid} at its turn 1" in text
        save(app, "fork")


def _ps() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout


async def test_programs_from_the_terminal(up: CoxUp) -> None:
    """``!&command`` starts a program, ``/programs`` lists it, ``/kill N`` stops it; ``!command`` runs one."""
    import uuid

    mark = str(600000 + uuid.uuid4().int % 90000)
    app = ChatApp(ChatApi(up.url, up.token), None, workspace="tui-programs")
    async with app.run_test(size=(140, 48)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        await paste(pilot, "!echo from-the-person")
        await pilot.press("enter")
        await until(pilot, lambda: "from-the-person" in shown(app), "the !command's output")
        await paste(pilot, f"!&sleep {mark}")
        await pilot.press("enter")
        await until(pilot, lambda: f"started: sleep {mark}" in shown(app), "the program's start")
        await paste(pilot, "/programs")
        await pilot.press("enter")
        await until(pilot, lambda: "1. sleep (" in shown(app) and "by person" in shown(app), "the program list")
        await paste(pilot, "/kill 1")
        await pilot.press("enter")
        await until(pilot, lambda: "stopped (by you)" in shown(app), "the program stopped")
        deadline = time.monotonic() + 10
        while f"sleep {mark}" in _ps() and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert f"sleep {mark}" not in _ps()
        await paste(pilot, "/programs")
        await pilot.press("enter")
        await until(pilot, lambda: "No programs are running" in shown(app), "an empty list")
        save(app, "programs")


async def test_attach_from_the_terminal(up: CoxUp, tmp_path: Path) -> None:
    """``/attach PATH`` uploads a file for the next message, which carries it (its ``user.msg``
    names it, the transcript shows it); a Lead with a file attached is refused before it is sent
    and keeps both; ``/attach -`` drops them; a file that cannot be read is said so."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the build fails on line 3\n")
    app = ChatApp(ChatApi(up.url, up.token), None, workspace="tui-attach")
    async with app.run_test(size=(140, 48)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        assert app.m is not None
        sid = app.m.sid
        await paste(pilot, f"/attach {tmp_path / 'missing.txt'}")
        await pilot.press("enter")
        await until(pilot, lambda: "cannot read" in shown(app), "an unreadable file said so")
        await paste(pilot, f"/attach {notes}")
        await pilot.press("enter")
        await until(pilot, lambda: "Attached notes.txt (text/plain, 26 bytes)" in shown(app), "the upload")
        await paste(pilot, "a Lead")
        await pilot.press("ctrl+l")
        await until(pilot, lambda: "A Lead is text only" in shown(app), "the Lead refused")
        assert app.draft.value == "a Lead" and len(app.attached) == 1
        await paste(pilot, said("read it", {"text": "read"}))
        await pilot.press("enter")
        await until(pilot, lambda: "[attached: notes.txt (text/plain, 26 bytes)]" in shown(app), "the message's file")
        assert app.attached == [], "sent with the message, not again with the next"
        evs = [e async for e in app.api.backlog(sid, 0)]
        [msg] = [e for e in evs if e["type"] == "user.msg"]
        [att] = msg["attachments"]
        assert att["name"] == "notes.txt" and att["size"] == 26 and len(att["sha256"]) == 64
        await paste(pilot, f"/attach {notes}")
        await pilot.press("enter")
        await paste(pilot, "/attach -")
        await pilot.press("enter")
        await until(pilot, lambda: "Nothing attached now." in shown(app), "dropped")
        assert app.attached == []
        save(app, "attach")
