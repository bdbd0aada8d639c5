"""Daily spend budgets that pause (docs/api.md, "Budgets"): ``[limits] session_spend`` and
``principal_spend`` (USD per UTC day).

A turn that reaches one ends ``spend_limit`` with its plan carried; the session pauses: its queued
messages stay queued (not discarded), sends, queues, steers and Leads are 409 ``budget_reached``,
until an admin raises the budget (``PATCH {spend_limit}``, or the config and a SIGHUP reload of
the turn-runners), after which the queue runs on in order. A ``limit.warning`` comes at ``warn_at``.

The priced copy of the script model costs $0.01 per output token (``tokens: 3`` is $0.03) and
nothing for input; sessions are created with a title, so no title request costs anything.
Each test's sessions belong to a principal of their own (the principal's budget counts them all).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.support.checks import finished, last_seq, of_type, one
from tests.support.stack import Api, Stack, script, stack_fixture, tool

ALICE, BOB, PAT, ADMIN, CARL = "tok-alice", "tok-bob", "tok-pat", "tok-admin", "tok-carl"

LIMITS = """
[limits]
session_spend = 0.10
principal_spend = {principal}
warn_at = 0.5
"""
MODELS = """
[[model.providers]]
name = "script-priced"
kind = "script"
input_price = 0.0
output_price = 10000.0
"""

stack = stack_fixture("budgets", runners=1, config=LIMITS.format(principal="0.30") + MODELS,
                      tokens={ALICE: "alice", BOB: "bob", PAT: "pat", ADMIN: "ada", CARL: "carl"}, auth='roles = { ada = "admin" }')

PLAN = tool("plan_write", steps=["one", "two"])


def priced(c: Api, name: str) -> str:
    return str(c.create(name, model="script-priced", title=name)["id"])


def starts_after(c: Api, sid: str, after: int, n: int) -> list[dict[str, Any]]:
    """The next ``n`` turn starts after seq ``after``, each turn run to its end."""
    out: list[dict[str, Any]] = []
    for _ in range(n):
        start = c.wait_type(sid, "turn.start", after=after)
        end = c.wait_type(sid, "turn.end", after=start["seq"])
        assert end["outcome"] == "completed", end
        out.append(start)
        after = end["seq"]
    return out


def test_a_session_over_its_budget_pauses_keeps_its_queue_and_goes_on_when_an_admin_raises_it(stack: Stack) -> None:
    with stack.client(ALICE) as alice, stack.client(ADMIN) as ada, stack.client(BOB) as bob:
        sid = priced(alice, "over-budget")
        # $0.03, $0.03 (the warning: 0.06 is over half of 0.10), $0.05 (0.11: the budget is reached)
        r = alice.send(sid, script({"tokens": 3, "delay_ms": 1500, "tools": [PLAN]},
                                   {"tokens": 3, "tools": [tool("respond", text="more")]},
                                   {"tokens": 5, "tools": [tool("respond", text="still more")]},
                                   {"text": "not reached"}))
        assert r.status_code == 202 and r.json()["disposition"] == "started"
        queued = []
        for text in ("first queued", "second queued"):
            q = alice.send(sid, text, mode="queue")
            assert q.status_code == 202 and q.json()["disposition"] == "queued", q.text
            queued.append(q.json()["message_id"])

        end, evs = finished(alice, sid)
        assert end["outcome"] == "spend_limit" and "session_spend" in end["detail"]
        warning = one(evs, "limit.warning", limit="session_spend")
        assert warning["value"] == pytest.approx(0.06) and warning["of"] == pytest.approx(0.10)
        hard = one(evs, "limit.hard", limit="session_spend")
        assert hard["value"] == pytest.approx(0.11)
        reached = one(evs, "budget.reached")
        assert reached["budget"] == "session_spend" and reached["waiting"] == 2 and reached["seq"] > end["seq"]
        assert not of_type(evs, "queue.discarded"), "the queue is not discarded"
        assert one(evs, "tool.skipped")["reason"] == "limit"

        s = alice.session(sid)
        assert not s["busy"] and [q["message_id"] for q in s["queue"]] == queued, "both queued messages survive"
        assert s["budget_reached"]["budget"] == "session_spend" and s["budget_reached"]["limit"] == pytest.approx(0.10)
        assert s["spend_today"] == pytest.approx(0.11) and s["spend_limit"] is None
        assert s["plan"] is not None and s["plan"]["steps"] == ["one", "two"], "the plan is kept to be carried"

        for mode in (None, "queue", "steer"):
            refused = alice.send(sid, "one more", mode=mode)
            assert refused.status_code == 409 and refused.json()["error"] == "budget_reached", refused.text
            assert "session_spend" in refused.json()["detail"] and "$0.1" in refused.json()["detail"]
        lead = alice.http.post(f"/v1/sessions/{sid}/lead", json={"text": "hurry"})
        assert lead.status_code == 409 and lead.json()["error"] == "budget_reached"
        assert alice.http.post(f"/v1/sessions/{sid}/stop").status_code == 200, "Stop still answers"

        # only an admin changes a budget: the owner (a member) gets 403, a stranger 404
        mine = alice.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": 1.0})
        assert mine.status_code == 403 and mine.json()["error"] == "forbidden"
        assert bob.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": 1.0}).status_code == 404
        for bad in (-1, "1", True):
            r = ada.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": bad})
            assert r.status_code == 422 and r.json()["error"] == "invalid", (bad, r.text)
        assert [q["message_id"] for q in alice.session(sid)["queue"]] == queued, "nothing refused changed the queue"

        # a raise that is still under what was spent keeps it paused
        r = ada.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": 0.11})
        assert r.status_code == 200 and r.json()["budget_reached"] is not None and r.json()["spend_limit"] == 0.11
        after = last_seq(alice, sid)
        r = ada.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": 0.5})
        assert r.status_code == 200, r.text
        starts = starts_after(alice, sid, after, 2)
        assert [e["message_id"] for e in starts] == queued, "the queue runs on in order"
        evs = alice.all_events(sid)
        assert one(evs, "budget.resumed")["by"] == "patch"
        updated = [e for e in of_type(evs, "session.updated") if "spend_limit" in e["changes"]]
        assert [e["changes"]["spend_limit"] for e in updated] == [0.11, 0.5]
        carried = [e for e in of_type(evs, "plan.carried") if e["seq"] > starts[0]["seq"]]
        assert carried and carried[0]["steps"] == ["one", "two"], "the first queued turn carries the plan"
        s = alice.wait_idle(sid)
        assert s["budget_reached"] is None and s["queue"] == [] and s["spend_limit"] == 0.5
        ok = alice.send(sid, "and now a send")
        assert ok.status_code == 202 and ok.json()["disposition"] == "started"
        finished(alice, sid)

        # null clears the session's own budget: [limits] session_spend applies again
        r = ada.http.patch(f"/v1/sessions/{sid}", json={"spend_limit": None})
        assert r.status_code == 200 and r.json()["spend_limit"] is None


def test_the_principal_budget_pauses_every_session_of_the_principal_until_a_reload_raises_it(stack: Stack) -> None:
    cfg = stack.tmp / "coxswain.toml"
    original = cfg.read_text()
    with stack.client(PAT) as pat, stack.client(ADMIN) as ada:
        one_sid, two_sid = priced(pat, "pat-one"), priced(pat, "pat-two")
        # the first session's own budget is an admin's $1: the principal's $0.30 is what stops it
        assert ada.http.patch(f"/v1/sessions/{one_sid}", json={"spend_limit": 1.0}).status_code == 200
        assert pat.send(two_sid, script({"tokens": 8, "text": "a small one"})).status_code == 202
        end, _ = finished(pat, two_sid)
        assert end["outcome"] == "completed"
        assert pat.session(two_sid)["spend_today"] == pytest.approx(0.08)

        r = pat.send(one_sid, script({"tokens": 10, "delay_ms": 1000, "tools": [tool("respond", text="a")]},
                                     {"tokens": 15, "tools": [tool("respond", text="b")]}, {"text": "not reached"}))
        assert r.status_code == 202
        queued = pat.send(one_sid, "after the raise", mode="queue")
        assert queued.status_code == 202 and queued.json()["disposition"] == "queued"
        end, evs = finished(pat, one_sid)
        assert end["outcome"] == "spend_limit" and "principal_spend" in end["detail"]
        warning = one(evs, "limit.warning", limit="principal_spend")
        assert warning["value"] == pytest.approx(0.18) and warning["of"] == pytest.approx(0.30)
        assert one(evs, "budget.reached")["budget"] == "principal_spend"
        assert pat.session(one_sid)["spend_today"] == pytest.approx(0.25), "0.08 + 0.25 across the two sessions"

        # the other session of the principal is refused too, though it was never paused
        refused = pat.send(two_sid, "more please")
        assert refused.status_code == 409 and refused.json()["error"] == "budget_reached"
        assert "principal_spend" in refused.json()["detail"]

        try:
            cfg.write_text(original.replace("principal_spend = 0.30", "principal_spend = 2.0"))
            after = last_seq(pat, one_sid)
            stack.signal("turn-runner-1", signal.SIGHUP)
            start = pat.wait_type(one_sid, "turn.start", after=after)
            assert start["message_id"] == queued.json()["message_id"]
            assert one(pat.events(one_sid, after=after), "budget.resumed")["by"] == "reload"
            finished(pat, one_sid, after=start["seq"])
            ok = pat.send(two_sid, "more please")
            assert ok.status_code == 202, ok.text
            finished(pat, two_sid)
        finally:
            cfg.write_text(original)
            stack.signal("turn-runner-1", signal.SIGHUP)


def test_a_response_that_reaches_the_budget_runs_none_of_its_calls_not_even_a_read(stack: Stack) -> None:
    """A response whose first call is a read is recorded with that read's result, except with a
    daily budget: its cost is counted first, and a budget it reaches ends the turn before the read."""
    with stack.client(CARL) as carl:
        sid = priced(carl, "reached-by-a-read-step")
        assert carl.send(sid, script({"tokens": 11, "tools": [tool("list_dir", path=".")]},
                                     {"text": "never asked"})).status_code == 202
        end, evs = finished(carl, sid)
    assert end["outcome"] == "spend_limit" and "session_spend" in end["detail"]
    msg = one(evs, "assistant.msg")
    assert [c["name"] for c in msg["tool_calls"]] == ["list_dir"]
    skipped = one(evs, "tool.skipped", call_id=msg["tool_calls"][0]["call_id"])
    assert skipped["reason"] == "limit" and not of_type(evs, "tool.result"), "the read did not run"
    assert one(evs, "limit.hard", limit="session_spend")["seq"] > msg["seq"]
