"""Idempotent transitions on whole stacks whose runner drops a reply after Redis ran the call
(``COX_FAULT_DROP_REPLY``, docs/operations.md): the turn goes on as if nothing happened. (The
library's own semantics on a bare Redis: tests/redis/test_idempotent_library.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.logcheck import log_of, replay
from tests.support.runners import records
from tests.support.stack import Api, Stack, script, stack_fixture

FAULTS = {"COX_TEST_FAULTS": "1"}


def ok(resp: Any, status: int = 202) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    return dict(resp.json())


def work(label: str) -> str:
    """A turn with a tool round (a written file) that runs long enough for a message to queue."""
    return script({"text": f"{label}: writing", "delay_ms": 400,
                   "tools": [{"name": "write_file", "args": {"path": f"{label}.txt", "content": label}}]},
                  {"text": f"{label} done"}, text=label)


def retried(stack: Stack) -> list[dict[str, Any]]:
    return [rec for name in stack.runner_names() for rec in records(stack, name)
            if rec.get("event") in ("redis.call_retry", "redis.call_failed", "drive.store_down", "drive.lease_lost")]


def shape(evs: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """A log with ids and times taken out: what two runs of the same messages must share."""
    return [(e["type"], e.get("outcome", ""), e.get("via", ""), e.get("name", ""), str(e.get("ok", "")))
            for e in evs if e["type"] not in ("assistant.delta", "usage")]


def run_two(api: Api, name: str) -> tuple[str, list[dict[str, Any]]]:
    """A session, a message that starts and one queued behind it; both run to their end."""
    sid = api.create(name)["id"]
    a = ok(api.send(sid, work("one")))
    assert a["disposition"] == "started", a
    b = ok(api.send(sid, work("two"), mode="queue"))
    assert b["disposition"] == "queued", b
    api.wait_idle(sid, timeout=30)
    evs = log_of(api, sid)
    rep = replay(evs)
    assert rep.starts == [a["message_id"], b["message_id"]]
    assert sorted(rep.ends.values()) == ["completed", "completed"], rep.ends
    assert [e["type"] for e in evs].count("turn.end") == 2
    ws = Path(api.session(sid)["workspace"])
    assert (ws / "one.txt").read_text() == "one" and (ws / "two.txt").read_text() == "two"
    return sid, evs


turn_end_dropped = stack_fixture("idem-turn-end", runners=1,
                                 runner_env={**FAULTS, "COX_FAULT_DROP_REPLY": "cox_turn_end:1"})


def test_a_lost_turn_end_reply_no_longer_crashes_the_next_message(turn_end_dropped: Stack) -> None:
    """The first turn_end ran (turn 1 ended, the queued message began in the same call) and its
    reply was lost: the retry gets that reply, so the runner runs the begun turn, not a takeover."""
    with turn_end_dropped.client() as api:
        sid, evs = run_two(api, "lost-turn-end")
        seen = retried(turn_end_dropped)
        assert [(x["event"], x["fn"]) for x in seen] == [("redis.call_retry", "cox_turn_end")], seen
        # the next message on the same session runs as usual
        c = ok(api.send(sid, "three"))
        st = api.wait_type(sid, "turn.start", message_id=c["message_id"], after=evs[-1]["seq"])
        assert api.wait_type(sid, "turn.end", turn_id=st["turn_id"])["outcome"] == "completed"
        replay(log_of(api, sid))


begin_and_emit_dropped = stack_fixture("idem-begin-emit", runners=1, runner_env={
    **FAULTS, "COX_FAULT_DROP_REPLY": "cox_send:1,cox_emit:2,cox_emit:3,cox_op_begin:1"})


def test_lost_replies_of_a_begin_and_of_an_emit_record_nothing_twice(begin_and_emit_dropped: Stack) -> None:
    """The first send (it began the turn) and the second emit (twice in a row) ran, their replies
    lost: the send is still answered 202 started and its turn runs; the log is the same as a clean
    run of the same messages on the same runner: no event twice, no gap, every turn completed."""
    stack = begin_and_emit_dropped
    with stack.client() as api:
        _, faulted = run_two(api, "lost-begin-emit")
        seen = retried(stack)
        assert sorted((x["event"], x["fn"], x["attempt"]) for x in seen if x["fn"] != "cox_op_begin") == [
            ("redis.call_retry", "cox_emit", 1), ("redis.call_retry", "cox_emit", 2),
            ("redis.call_retry", "cox_send", 1)], seen
        _, clean = run_two(api, "clean")  # the plan is used up: nothing is dropped now
        assert len(retried(stack)) == len(seen)
        assert shape(faulted) == shape(clean)


def test_a_lost_reply_of_a_persons_short_lease_leaves_no_session_stuck_busy(begin_and_emit_dropped: Stack) -> None:
    """A ``!command`` on an idle session takes a short lease (cox_op_begin) whose reply is lost:
    the retry gets the token the first attempt took (not 409 busy from its own lease), so the
    command runs under it and the session is idle again at once, not after a takeover."""
    stack = begin_and_emit_dropped
    with stack.client() as api:
        sid = api.create("lost-op-begin")["id"]
        r = api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "printf observed-once"})
        assert r.status_code == 202, r.text
        assert api.session(sid)["busy"] is False, "the person's lease was released with the command's end"
        evs = log_of(api, sid)
        assert [e["output"] for e in evs if e["type"] == "observed"] == ["exit code 0\nobserved-once"]
        seen = [x for x in retried(stack) if x.get("fn") == "cox_op_begin"]
        assert [(x["event"], x["attempt"]) for x in seen] == [("redis.call_retry", 1)], seen
        assert not [x for x in records(stack, stack.runner_names()[0]) if x.get("event") == "lease.claimed"]
