"""Hard and soft limits, spend, and the plans of turns they end (docs/design.md, "The turn loop").

The stack here lowers the hard limits so a test reaches them quickly, sets a soft tool-call
limit of 2 (a checkpoint that asks the person) and a priced copy of the script model so a turn
has a cost. Tests that are not about the checkpoint turn the don't-ask switch on, which answers
it (the ``limit.soft`` event is still recorded).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.checks import finished, last_seq, of_type, one
from tests.support.stack import Api, Stack, script, stack_fixture, tool

CONFIG = """
[limits]
tool_calls = 8
actions = 4
tokens = 20000
seconds = 5
spend = 0.05

[limits.soft]
tool_calls = 2
spend = 0.02

[[model.providers]]
name = "script-priced"
kind = "script"
input_price = 0.0
output_price = 10000.0
"""
"""The priced script model costs $0.01 per output token: ``tokens: 6`` is $0.06."""


stack = stack_fixture("limits", runners=1, config=CONFIG)



def ticks(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [tool("respond", text=f"tick {i}") for i in range(start, start + n)]


def quiet(api: Api, name: str, **kw: Any) -> str:
    s = api.create(name, **kw)
    r = api.http.patch(f"/v1/sessions/{s['id']}", json={"dont_ask": True})
    assert r.status_code == 200
    return str(s["id"])


def carried_next(api: Api, sid: str) -> dict[str, Any]:
    after = last_seq(api, sid)
    api.send(sid, "go on")
    _, evs = finished(api, sid, after=after)
    return one(evs, "plan.carried")


PLAN = tool("plan_write", steps=["one", "two"])


def test_a_soft_limit_set_lower_asks_and_allow_goes_on(stack: Stack, api: Api) -> None:
    s = api.create("soft-allow")
    sid = s["id"]
    api.send(sid, script({"tools": ticks(2)}, {"tools": ticks(2, 2)}, {"text": "Done."}))
    soft = api.wait_type(sid, "limit.soft")
    assert soft["limit"] == "tool_calls" and soft["value"] == 2
    pending = api.wait_type(sid, "approval.pending")
    assert pending["name"] == "continue" and pending["args"]["limit"] == "tool_calls"
    assert [a["name"] for a in api.session(sid)["approvals"]] == ["continue"]
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
    assert r.status_code == 200
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert len(of_type(evs, "agent.message")) == 4
    assert len(of_type(evs, "limit.soft")) == 1, "asked once per limit and turn"
    assert soft["seq"] < pending["seq"] < of_type(evs, "tool.call")[2]["seq"], "asked before the third call"


def test_a_soft_limit_declined_ends_the_turn_canceled_and_carries_the_plan(stack: Stack, api: Api) -> None:
    s = api.create("soft-deny")
    sid = s["id"]
    api.send(sid, script({"tools": [PLAN, tool("plan_step", step=1), tool("respond", text="x"),
                                    tool("respond", text="y")]}, {"text": "not reached"}))
    pending = api.wait_type(sid, "approval.pending")
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "deny"})
    end, evs = finished(api, sid)
    assert end["outcome"] == "canceled"
    assert [e["reason"] for e in of_type(evs, "tool.skipped")] == ["canceled", "canceled"]
    carried = carried_next(api, sid)
    assert carried["steps"] == ["one", "two"] and carried["marks"] == [1]


def test_dont_ask_answers_the_soft_checkpoint(stack: Stack, api: Api) -> None:
    sid = quiet(api, "soft-quiet")
    api.send(sid, script({"tools": ticks(4)}, {"text": "Done."}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert one(evs, "limit.soft")["limit"] == "tool_calls"
    assert not of_type(evs, "approval.pending")


def test_hard_tool_call_limit(stack: Stack, api: Api) -> None:
    sid = quiet(api, "hard-calls")
    api.send(sid, script({"tools": [PLAN, *ticks(9)]}, {"text": "not reached"}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "hard_budget" and "tool_calls" in end["detail"]
    assert one(evs, "limit.hard")["limit"] == "tool_calls"
    assert len(of_type(evs, "tool.result")) == 8
    assert [e["reason"] for e in of_type(evs, "tool.skipped")] == ["limit", "limit"]
    assert carried_next(api, sid)["marks"] == []


def test_hard_action_limit(stack: Stack, api: Api) -> None:
    sid = quiet(api, "hard-actions")
    writes = [tool("write_file", path=f"f{i}.txt", content=str(i)) for i in range(5)]
    api.send(sid, script({"tools": writes}, {"text": "not reached"}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "hard_budget"
    assert one(evs, "limit.hard")["limit"] == "actions"
    assert len(of_type(evs, "file.written")) == 4 and len(of_type(evs, "tool.skipped")) == 1


def test_hard_token_limit(stack: Stack, api: Api) -> None:
    sid = quiet(api, "hard-tokens")
    api.send(sid, script({"tokens": 25000, "tools": [tool("respond", text="never")]}, {"text": "not reached"}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "hard_budget"
    assert one(evs, "limit.hard")["limit"] == "tokens"
    assert one(evs, "tool.skipped")["reason"] == "limit"
    assert not of_type(evs, "agent.message")


def test_hard_time_limit_while_the_model_answers_and_while_a_command_runs(stack: Stack, api: Api) -> None:
    sid = quiet(api, "hard-time")
    t0 = time.monotonic()
    api.send(sid, script({"text": "slow", "delay_ms": 30000}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "hard_budget" and one(evs, "limit.hard")["limit"] == "seconds"
    assert time.monotonic() - t0 < 20

    after = last_seq(api, sid)
    api.send(sid, script({"tools": [tool("run_command", command="sleep 30")]}, {"text": "not reached"}))
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "hard_budget"
    result = next(e for e in of_type(evs, "tool.result") if e["seq"] > after)
    assert "timed out" in result["output"], "the command was bounded by the time left"


def test_time_waiting_for_the_person_does_not_count(stack: Stack, api: Api) -> None:
    s = api.create("wait-time")
    sid = s["id"]
    api.send(sid, script({"tools": [tool("run_command", command="touch w.txt")]}, {"text": "Done."}))
    pending = api.wait_type(sid, "approval.pending")
    time.sleep(6)  # longer than the 5 s hard time limit: the turn must still be running
    assert api.session(sid)["busy"] is True
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
    end, _ = finished(api, sid)
    assert end["outcome"] == "completed"


def test_spend_limit_and_soft_spend_checkpoint(stack: Stack, api: Api) -> None:
    s = api.create("spend", model="script-priced")
    sid = s["id"]
    api.send(sid, script({"tokens": 3, "tools": [PLAN]}, {"tokens": 3, "tools": [tool("respond", text="more")]},
                         {"text": "not reached"}))
    soft = api.wait_type(sid, "limit.soft")
    assert soft["limit"] == "spend" and soft["value"] == pytest.approx(0.03)
    pending = api.wait_type(sid, "approval.pending")
    assert pending["args"]["limit"] == "spend"
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
    end, evs = finished(api, sid)
    assert end["outcome"] == "spend_limit"
    hard = one(evs, "limit.hard")
    assert hard["limit"] == "spend" and hard["value"] == pytest.approx(0.06)
    assert of_type(evs, "assistant.msg")[0]["usage"]["cost"] == pytest.approx(0.03)
    assert one(evs, "tool.skipped")["reason"] == "limit"
    assert carried_next(api, sid)["steps"] == ["one", "two"]


def test_a_checkpoint_answered_with_a_message_delivers_it_before_the_next_call(stack: Stack, api: Api) -> None:
    s = api.create("soft-message")
    sid = s["id"]
    api.send(sid, script({"tools": ticks(4)}, {"text": "not reached"}))
    pending = api.wait_type(sid, "approval.pending")
    msg = script({"text": "Changed course."}, text="enough ticks")
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}",
                      json={"decision": "allow", "message": msg})
    assert r.status_code == 200
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert [e["reason"] for e in of_type(evs, "tool.skipped")] == ["approval", "approval"]
    user = one(evs, "user.msg", via="approval")
    assert user["text"] == msg and user["seq"] < of_type(evs, "tool.skipped")[0]["seq"]
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Changed course."
