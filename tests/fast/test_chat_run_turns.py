"""A run's turn count in both clients (``cox chat``'s ChatModel and the console's state.js) when
the session object is read after the backlog and a turn began between the two.

Both open a session the same way: the backlog, then the session object (its ``run.turns``
counts every turn begun up to its ``last_seq``), then the live stream from where the backlog
ended. A turn that began in between is in the object's count and then arrives on the stream;
counting it again showed "turn 3 of 4" at a run's second turn (a CI run of
tests/stack/test_chat_runs.py). An event at or before the object's ``last_seq`` is already in
its count; a ``run.start`` or ``run.end`` there says nothing newer about the run than it does.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cox.chat_state import ChatModel

SID = "s_1"


def backlog() -> list[dict[str, Any]]:
    """A run created, its first turn begun (seq 1-3)."""
    return [
        {"type": "run.start", "seq": 1, "sid": SID, "confirm": "judge", "unattended": False, "max_turns": 4},
        {"type": "user.msg", "seq": 2, "sid": SID, "turn_id": "t1", "message_id": "m1", "text": "go", "via": "run"},
        {"type": "turn.start", "seq": 3, "sid": SID, "turn_id": "t1", "message_id": "m1", "model": "x"},
    ]


def later() -> list[dict[str, Any]]:
    """The first turn ends, the run's continue begins the second (seq 4-6)."""
    return [
        {"type": "turn.end", "seq": 4, "sid": SID, "turn_id": "t1", "outcome": "hard_budget"},
        {"type": "user.msg", "seq": 5, "sid": SID, "turn_id": "t2", "message_id": "m2", "text": "continue", "via": "run"},
        {"type": "turn.start", "seq": 6, "sid": SID, "turn_id": "t2", "message_id": "m2", "model": "x"},
    ]


def third() -> list[dict[str, Any]]:
    return [
        {"type": "turn.end", "seq": 7, "sid": SID, "turn_id": "t2", "outcome": "hard_budget"},
        {"type": "user.msg", "seq": 8, "sid": SID, "turn_id": "t3", "message_id": "m3", "text": "continue", "via": "run"},
        {"type": "turn.start", "seq": 9, "sid": SID, "turn_id": "t3", "message_id": "m3", "model": "x"},
    ]


def session(turns: int, last_seq: int, state: str = "running") -> dict[str, Any]:
    return {"id": SID, "busy": True, "turn_id": f"t{turns}", "queue": [], "leads": [], "approvals": [],
            "plan": None, "last_seq": last_seq,
            "run": {"state": state, "confirm": "judge", "unattended": False, "max_turns": 4, "turns": turns,
                    "outcome": None}}


# (what the session object says, the stream after the backlog, the run's turns to show)
CASES = [
    ("object read after the second turn began", session(2, 6), later(), 2),
    ("object read before it", session(1, 3), later(), 2),
    ("object after the second, stream to the third", session(2, 6), later() + third(), 3),
]


def python_turns(obj: dict[str, Any], stream: list[dict[str, Any]]) -> tuple[Any, float]:
    m = ChatModel(SID)
    for ev in backlog():
        m.apply(ev)
    m.apply_session(copy.deepcopy(obj))
    m.replaying = False
    for ev in stream:
        m.apply(ev)
    return m.info["run"]["turns"], m.totals["turns"]


@pytest.mark.parametrize(("name", "obj", "stream", "want"), CASES, ids=[c[0] for c in CASES])
def test_cox_chat_counts_each_run_turn_once(name: str, obj: dict[str, Any], stream: list[dict[str, Any]],
                                            want: int) -> None:
    assert python_turns(obj, stream) == (want, want), name


def test_cox_chat_keeps_the_objects_run_over_an_older_run_start() -> None:
    """The backlog read nothing yet (a session opened as its run was being created): the
    run.start that then arrives is older than the object, which already counts the first turn."""
    m = ChatModel(SID)
    m.apply_session(session(1, 3))
    m.replaying = False
    for ev in backlog() + later():
        m.apply(ev)
    assert m.info["run"]["turns"] == 2 and m.info["run"]["state"] == "running"
    # a run.end that the object had not seen is applied as before
    m.apply({"type": "run.end", "seq": 7, "sid": SID, "outcome": "stopped", "turns": 2})
    assert m.info["run"] == {**m.info["run"], "state": "ended", "outcome": "stopped", "turns": 2}
    assert m.run_driving() is None


JS = Path(__file__).resolve().parents[2] / "services/gateway/cox_gateway/static/js/state.js"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize(("name", "obj", "stream", "want"), CASES, ids=[c[0] for c in CASES])
def test_the_console_counts_each_run_turn_once(tmp_path: Path, name: str, obj: dict[str, Any],
                                               stream: list[dict[str, Any]], want: int) -> None:
    probe = tmp_path / "probe.mjs"
    probe.write_text(f"""
import * as st from {json.dumps(JS.as_uri())};
const m = new st.SessionModel({json.dumps(SID)});
for (const ev of {json.dumps(backlog())}) m.apply(ev);
m.applySession({json.dumps(obj)});
m.replaying = false;
for (const ev of {json.dumps(stream)}) m.apply(ev);
console.log(JSON.stringify([m.info.run.turns, m.totals.turns]));
""")
    run = subprocess.run(["node", str(probe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [want, want], name
