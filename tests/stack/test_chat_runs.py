"""``cox chat SID`` on a run, with Textual's headless pilot against a real ``cox up``
(docs/api.md, Runs): a status line says a run drives the session (its confirm mode, turn n of
max); Enter is refused with the server's ``run_active`` said plainly and the text is kept; Esc
stops the run (``run.end stopped``); after that the session is an ordinary chat.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cox.chat_app import ChatApp
from cox.chat_client import ChatApi
from tests.stack.test_chat import paste, save, shown, until
from tests.support.coxup import CoxUp, cox_up
from tests.support.stack import script, tool

# Three tool calls a turn: the run's first turn (four calls) ends hard_budget and the run goes on.
CONFIG = """
[limits]
tool_calls = 3
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoxUp]:
    with cox_up(tmp_path_factory.mktemp("chat-runs"), CONFIG) as u:
        yield u


def http(up: CoxUp) -> httpx.Client:
    return httpx.Client(base_url=up.url, headers={"Authorization": f"Bearer {up.token}"}, timeout=30)


def events(up: CoxUp, sid: str) -> list[dict[str, Any]]:
    with http(up) as c:
        r = c.get(f"/v1/sessions/{sid}/events", params={"format": "json", "after": 0})
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_cox_chat_on_a_run_says_so_refuses_enter_stops_it_and_then_is_a_chat(up: CoxUp) -> None:
    text = script({"tools": [tool("find_files", pattern=f"*.{x}") for x in "abcd"]},
                  {"text": "Working slowly on the second turn.", "delay_ms": 60_000})
    with http(up) as c:
        r = c.post("/v1/runs", json={"text": text, "workspace": "chat-run", "max_turns": 4, "confirm": "judge"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]

    app = ChatApp(ChatApi(up.url, up.token), sid)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.stream_status == "live", "the stream is live")
        await until(pilot, lambda: "turn 2 of 4" in shown(app, "#run"), "the run's status line at its second turn")
        line = shown(app, "#run")
        assert "a run drives this session (confirm judge, turn 2 of 4)" in line
        assert "Esc stops the run" in line and "Ctrl+L" not in line, "a judge run is not supervised: no Lead"
        assert "run running" in shown(app, "#head")
        transcript = shown(app, "#transcript Static")
        assert "Run started: the program drives this session (confirm judge, at most 4 turns)" in transcript
        assert "Turn ended: hard_budget" in transcript
        assert "you (sent by the run): continue" in transcript
        await until(pilot, lambda: "model: Working" in shown(app, "#transcript Static"), "the second turn streams")

        # Enter while the run drives: the server's run_active, said as such; the text is kept.
        await paste(pilot, "let me in")
        await pilot.press("enter")
        await until(pilot, lambda: "run_active" in shown(app, "#note"), "the refusal")
        assert "Refused: a run drives this session (run_active), so nothing was sent." in shown(app, "#note")
        assert app.draft.value == "let me in"
        # A Lead into a run that is not supervised: refused, and why.
        await pilot.press("ctrl+l")
        await until(pilot, lambda: "not supervised" in shown(app, "#note"), "the Lead's refusal")
        assert app.draft.value == "let me in"
        assert not [e for e in events(up, sid) if e["type"] in ("user.msg", "lead.saved") and e.get("text") == "let me in"]
        save(app, "run-driving")

        # Esc stops the turn and the run.
        await pilot.press("escape")
        await until(pilot, lambda: "Run ended: stopped after 2 turns" in shown(app, "#transcript Static"), "run.end")
        assert "the run ends (run.end stopped)" in shown(app, "#note")
        assert shown(app, "#run") == ""
        assert "run ended stopped" in shown(app, "#head")
        ends = [e for e in events(up, sid) if e["type"] == "run.end"]
        assert [(e["outcome"], e["turns"]) for e in ends] == [("stopped", 2)]

        # Now an ordinary chat: Enter sends the kept text and the turn completes.
        await until(pilot, lambda: "idle" in shown(app, "#head"), "idle after the run")
        await pilot.press("enter")
        await until(pilot, lambda: "you: let me in" in shown(app, "#transcript Static"), "the message sent")
        await until(pilot, lambda: "Turn ended: completed" in shown(app, "#transcript Static"), "the chat's turn")
        assert app.draft.value == ""
        msgs = [e for e in events(up, sid) if e["type"] == "user.msg"]
        assert msgs[-1]["via"] == "send" and msgs[-1]["text"] == "let me in"
        save(app, "run-ended")
