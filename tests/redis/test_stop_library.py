"""A Stop against a turn that is ending, in the library on a real Redis (no runner).

``cox_stop`` answers with the running turn's id, and the API promises that turn ends ``stopped``.
A runner can have finished the turn (its last response in, its outcome decided) a moment before
the Stop landed, and still be on its way to ``cox_turn_end``: the two scripts are ordered in
Redis, so the one that ends the turn sees the Stop's flag and records ``stopped`` (the outcome the
runner had decided is kept in the detail). A steer is not a Stop: the turn that completed before
it could see the steer stays ``completed`` and the steered message runs next. (Whole stacks with
random faults: tests/faults/test_random_faults.py, which found it: seed 2022.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from coxswain import keys
from tests.support.library import Library

_n = 0


def busy_session(lib: Library) -> tuple[str, str]:
    sid = lib.create("s_stop")
    sent = send(lib, sid, "m_1", "first", "", "t_1")
    assert sent["disposition"] == "started", sent
    return sid, str(sent["token"])


def send(lib: Library, sid: str, message_id: str, text: str, mode: str, turn_id: str) -> Any:
    return lib(lib.fns.send(sid=sid, principal="p", message_id=message_id, text=text, mode=mode, client_id="",
                            runner="r_1", lease_ms=5000, turn_id=turn_id, owner="", models="", agents_md=""))


def end(lib: Library, sid: str, token: str, outcome: str, detail: str | None = None) -> dict[str, Any]:
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "t_1", "outcome": outcome,
                       "finish_reason": None, "detail": detail})
    return dict(lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body=body, next_turn_id="t_2",
                                     lease_ms=5000, plan="", handoff="", hold_next="", agents_md="")))


def turn_ends(r: redis.Redis, sid: str) -> list[dict[str, Any]]:
    evs = [json.loads(x) for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]
    return [e for e in evs if e["type"] == "turn.end"]


@pytest.mark.parametrize("outcome", ["completed", "error", "output_limit", "empty", "canceled"])
def test_a_stop_answered_for_a_turn_makes_it_end_stopped(r: redis.Redis, lib: Library, outcome: str) -> None:
    sid, token = busy_session(lib)
    stopped = lib(lib.fns.stop(sid=sid, principal="p", owner=""))
    assert stopped["turn_id"] == "t_1" and stopped["stopped"] is True
    end(lib, sid, token, outcome, detail="the model said so")  # decided before the runner saw the Stop
    [e] = turn_ends(r, sid)
    assert e["outcome"] == "stopped", e
    assert outcome in e["detail"] and "the model said so" in e["detail"], e
    assert e["seq"] > 0 and e["turn_id"] == "t_1"
    assert r.hget(keys.session(sid), "busy") == "0", "nothing queued: idle"


def test_a_turn_that_ended_stopped_or_crashed_keeps_its_own_ending(r: redis.Redis, lib: Library) -> None:
    for outcome in ("stopped", "crashed"):
        sid, token = busy_session(lib)
        lib(lib.fns.stop(sid=sid, principal="p", owner=""))
        end(lib, sid, token, outcome, detail="own")
        [e] = turn_ends(r, sid)
        assert (e["outcome"], e["detail"]) == (outcome, "own")


def test_without_a_stop_and_after_a_steer_the_outcome_is_the_runners(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    end(lib, sid, token, "completed")
    assert [e["outcome"] for e in turn_ends(r, sid)] == ["completed"]

    sid, token = busy_session(lib)
    steered = send(lib, sid, "m_2", "instead", "steer", "t_x")
    assert steered["disposition"] != "started", steered
    nxt = end(lib, sid, token, "completed")
    assert [e["outcome"] for e in turn_ends(r, sid)] == ["completed"]
    assert nxt["next"]["message_id"] == "m_2", "the steered message runs next"


def test_a_stop_that_comes_after_the_end_stops_nothing(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    end(lib, sid, token, "completed")
    stopped = lib(lib.fns.stop(sid=sid, principal="p", owner=""))
    assert stopped["turn_id"] is None and stopped["stopped"] is False
    assert [e["outcome"] for e in turn_ends(r, sid)] == ["completed"]
