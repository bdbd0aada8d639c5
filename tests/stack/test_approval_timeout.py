"""``[approval] timeout_s``: an approval nobody answers in time is declined (actor ``timeout``)
and the turn goes on, so an unattended session never hangs; an answer in time wins."""

from __future__ import annotations

from pathlib import Path

from tests.support.checks import finished, last_seq, one
from tests.support.stack import Api, Stack, script, stack_fixture

TIMEOUT_S = 1.5

stack = stack_fixture("approval-timeout", runners=1, config=f"[approval]\ncommands = \"ask\"\ntimeout_s = {TIMEOUT_S}\n")


def touch(path: str) -> str:
    return script({"tools": [{"name": "run_command", "args": {"command": f"touch {path}"}}]}, {"text": "Went on."})


def test_an_unanswered_approval_is_declined_after_timeout_s_and_the_turn_goes_on(stack: Stack, api: Api) -> None:
    s = api.create("appr-timeout")
    sid = s["id"]
    api.send(sid, touch("late.txt"))
    pending = api.wait_type(sid, "approval.pending")
    end, evs = finished(api, sid, timeout=30)
    assert end["outcome"] == "completed"
    resolved = one(evs, "approval.resolved")
    assert (resolved["approval_id"], resolved["decision"], resolved["actor"]) == (pending["approval_id"], "deny", "timeout")
    assert "timeout_s" in resolved["reason"]
    waited_ms = resolved["ts"] - pending["ts"]
    assert TIMEOUT_S * 1000 - 50 <= waited_ms <= TIMEOUT_S * 1000 + 5000, waited_ms
    result = one(evs, "tool.result", call_id=pending["call_id"])
    assert result["ok"] is False and "nobody in time" in result["output"]
    assert not (Path(s["workspace"]) / "late.txt").exists(), "the declined command did not run"
    assert [e["text"] for e in evs if e["type"] == "assistant.msg"][-1] == "Went on."
    assert api.session(sid)["approvals"] == []


def test_an_answer_within_timeout_s_wins(stack: Stack, api: Api) -> None:
    s = api.create("appr-in-time")
    sid = s["id"]
    after = last_seq(api, sid)
    api.send(sid, touch("made.txt"))
    pending = api.wait_type(sid, "approval.pending", after=after)
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
    assert r.status_code == 200, r.text
    end, evs = finished(api, sid, after=after, timeout=30)
    assert end["outcome"] == "completed"
    assert one(evs, "approval.resolved")["actor"] == "person"
    assert (Path(s["workspace"]) / "made.txt").exists()
