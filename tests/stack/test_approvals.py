"""Approval gates (docs/design.md, "The turn loop" 5-6) — a pending approval stays open while Leads wait;
an answer may carry a message (deny+message redirects, allow+message augments) that becomes a
real user message after the tool result; answering twice is 409 ``resolved``.

``touch`` is not a read-only command, so the default rules judge refuses it and the person is asked.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.checks import finished, holder, last_seq, of_type, one
from tests.support.stack import OTHER_TOKEN, Api, Stack, script


def gated(path: str, *then: dict[str, Any], extra: list[dict[str, Any]] | None = None) -> str:
    tools = [{"name": "run_command", "args": {"command": f"touch {path}"}}, *(extra or [])]
    return script({"text": "Touching.", "tools": tools}, *then)


def answer(api: Api, sid: str, aid: str, decision: str, **kw: Any) -> Any:
    return api.http.post(f"/v1/sessions/{sid}/approvals/{aid}", json={"decision": decision, **kw})


def test_a_pending_approval_stays_open_while_a_lead_waits_then_the_call_runs(stack: Stack, api: Api) -> None:
    s = api.create("appr-lead-allow")
    sid = s["id"]
    ws = Path(s["workspace"])
    api.send(sid, gated("made.txt", {"text": "not reached"},
                        extra=[{"name": "write_file", "args": {"path": "x.txt", "content": "x"}}]))
    pending = api.wait_type(sid, "approval.pending")
    assert pending["judge"] and pending["judge"]["verdict"] == "refuse", "the judge was asked first"
    r = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": script({"text": "Lead seen."})})
    assert r.status_code == 202
    # The runner has been told (doorbell) and must not dismiss the approval: give it time to err.
    time.sleep(1.5)
    sess = api.session(sid)
    assert [a["approval_id"] for a in sess["approvals"]] == [pending["approval_id"]]
    assert [x["state"] for x in sess["leads"]] == ["pending"]
    assert not of_type(api.all_events(sid), "approval.resolved", "lead.applied")

    assert answer(api, sid, pending["approval_id"], "allow").status_code == 200
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert (ws / "made.txt").exists(), "the answered call ran"
    result = one(evs, "tool.result", call_id=pending["call_id"])
    assert result["ok"] is True
    skipped = one(evs, "tool.skipped", reason="lead")
    assert not (ws / "x.txt").exists()
    applied = one(evs, "lead.applied")
    assert result["seq"] < skipped["seq"] < applied["seq"], "the call ran, then the Leads applied"
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Lead seen."
    assert api.session(sid)["approvals"] == []


def test_a_denied_call_with_a_lead_waiting_is_denied_then_the_lead_applies(stack: Stack, api: Api) -> None:
    s = api.create("appr-lead-deny")
    sid = s["id"]
    api.send(sid, gated("never.txt", {"text": "not reached"}))
    pending = api.wait_type(sid, "approval.pending")
    api.http.post(f"/v1/sessions/{sid}/lead", json={"text": script({"text": "Lead after deny."})})
    api.wait_type(sid, "lead.saved")
    assert answer(api, sid, pending["approval_id"], "deny").status_code == 200
    _end, evs = finished(api, sid)
    result = one(evs, "tool.result", call_id=pending["call_id"])
    assert result["ok"] is False and "Denied" in result["output"]
    assert not (Path(s["workspace"]) / "never.txt").exists()
    assert one(evs, "lead.applied")["seq"] > result["seq"]
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Lead after deny."
    resolved = one(evs, "approval.resolved")
    assert resolved["decision"] == "deny" and resolved["actor"] == "person"


def test_deny_with_a_message_is_a_redirect_delivered_after_the_result(stack: Stack, api: Api) -> None:
    s = api.create("appr-redirect")
    sid = s["id"]
    api.send(sid, gated("r.txt", {"text": "old plan"},
                        extra=[{"name": "write_file", "args": {"path": "y.txt", "content": "y"}}]))
    pending = api.wait_type(sid, "approval.pending")
    msg = script({"text": "Redirected."}, text="Do not touch files; read README instead.")
    assert answer(api, sid, pending["approval_id"], "deny", message=msg).status_code == 200
    end, evs = finished(api, sid)
    resolved = one(evs, "approval.resolved")
    assert resolved["message"] == msg and resolved["decision"] == "deny"
    result = one(evs, "tool.result", call_id=pending["call_id"])
    assert result["ok"] is False
    user = one(evs, "user.msg", via="approval")
    assert user["text"] == msg and user["seq"] > result["seq"], "a real user message after the tool result"
    skipped = one(evs, "tool.skipped")
    assert skipped["reason"] == "approval", "the rest of that response waits for the newer instruction"
    assert not (Path(s["workspace"]) / "y.txt").exists()
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Redirected."
    assert end["outcome"] == "completed"


def test_allow_with_a_message_augments_the_call(stack: Stack, api: Api) -> None:
    s = api.create("appr-augment")
    sid = s["id"]
    api.send(sid, gated("aug.txt", {"text": "Carried on."}))
    pending = api.wait_type(sid, "approval.pending")
    assert answer(api, sid, pending["approval_id"], "allow", message="also list the folder after").status_code == 200
    _end, evs = finished(api, sid)
    assert (Path(s["workspace"]) / "aug.txt").exists()
    result = one(evs, "tool.result", call_id=pending["call_id"])
    user = one(evs, "user.msg", via="approval")
    assert result["ok"] is True and user["seq"] > result["seq"]
    assert user["text"] == "also list the folder after"
    # The message holds no script: the running script goes on with its next step.
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Carried on."


def test_answering_twice_is_resolved_and_unknown_is_404(stack: Stack, api: Api) -> None:
    s = api.create("appr-twice")
    sid = s["id"]
    api.send(sid, gated("t.txt", {"text": "ok"}))
    pending = api.wait_type(sid, "approval.pending")
    aid = pending["approval_id"]
    bad = answer(api, sid, aid, "maybe")
    assert bad.status_code == 422
    with stack.client(OTHER_TOKEN) as other:
        assert answer(other, sid, aid, "allow").status_code == 404
    assert answer(api, sid, "a_doesnotexist0000000000", "allow").status_code == 404
    assert answer(api, sid, aid, "allow").status_code == 200
    twice = answer(api, sid, aid, "deny")
    assert twice.status_code == 409 and twice.json()["error"] == "resolved"
    _, evs = finished(api, sid)
    assert len(of_type(evs, "approval.resolved")) == 1


def test_stop_dismisses_the_pending_approval(stack: Stack, api: Api) -> None:
    s = api.create("appr-stop")
    sid = s["id"]
    api.send(sid, gated("s.txt", {"text": "not reached"},
                        extra=[{"name": "write_file", "args": {"path": "z.txt", "content": "z"}}]))
    pending = api.wait_type(sid, "approval.pending")
    assert api.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
    end, evs = finished(api, sid)
    assert end["outcome"] == "stopped"
    resolved = one(evs, "approval.resolved")
    assert resolved["actor"] == "policy" and resolved["decision"] == "deny"
    assert one(evs, "tool.result", call_id=pending["call_id"])["output"].startswith("Cancelled")
    assert one(evs, "tool.skipped")["reason"] == "stop"
    assert api.session(sid)["approvals"] == []
    late = answer(api, sid, pending["approval_id"], "allow")
    assert late.status_code == 409 and late.json()["error"] == "resolved"
    assert not (Path(s["workspace"]) / "s.txt").exists()


def test_turning_dont_ask_on_answers_the_pending_approval(stack: Stack, api: Api) -> None:
    s = api.create("appr-dontask")
    sid = s["id"]
    api.send(sid, gated("d.txt", {"text": "Done."}))
    api.wait_type(sid, "approval.pending")
    r = api.http.patch(f"/v1/sessions/{sid}", json={"dont_ask": True})
    assert r.status_code == 200 and r.json()["dont_ask"] is True
    _, evs = finished(api, sid)
    assert one(evs, "approval.resolved")["actor"] == "dont_ask"
    assert (Path(s["workspace"]) / "d.txt").exists()


def test_a_turn_scope_allow_covers_the_rest_of_the_turn(stack: Stack, api: Api) -> None:
    s = api.create("appr-scope")
    sid = s["id"]
    api.send(sid, script(
        {"tools": [{"name": "run_command", "args": {"command": "mkdir -p one"}}]},
        {"tools": [{"name": "run_command", "args": {"command": "mkdir -p two"}}]},
        {"text": "Both."},
    ))
    pending = api.wait_type(sid, "approval.pending")
    assert answer(api, sid, pending["approval_id"], "allow", scope="turn").status_code == 200
    _, evs = finished(api, sid)
    assert len(of_type(evs, "approval.pending")) == 1
    assert (Path(s["workspace"]) / "two").is_dir()
    after = last_seq(api, sid)
    api.send(sid, script({"tools": [{"name": "run_command", "args": {"command": "mkdir -p three"}}]}))
    pending = api.wait_type(sid, "approval.pending", after=after)
    answer(api, sid, pending["approval_id"], "deny")
    finished(api, sid, after=after)


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
def test_a_crash_dismisses_the_pending_approval_and_leaves_the_lead_unapplied(stack: Stack, api: Api) -> None:
    s = api.create("appr-crash")
    sid = s["id"]
    api.send(sid, gated("c.txt", {"text": "not reached"}))
    pending = api.wait_type(sid, "approval.pending")
    lid = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": "kept through a crash"}).json()["lead_id"]
    victim = holder(stack, sid)
    stack.kill(victim)
    try:
        end, evs = finished(api, sid, timeout=40)
        assert end["outcome"] == "crashed"
        resolved = one(evs, "approval.resolved")
        assert resolved["actor"] == "policy" and resolved["approval_id"] == pending["approval_id"]
        assert one(evs, "lead.unapplied")["lead_ids"] == [lid]
        sess = api.session(sid)
        assert sess["approvals"] == [] and sess["leads"][0]["state"] == "unapplied"
        late = answer(api, sid, pending["approval_id"], "allow")
        assert late.status_code == 409 and late.json()["error"] == "resolved"
        assert not (Path(s["workspace"]) / "c.txt").exists()
    finally:
        stack.spawn(victim, "cox_runner")
        stack.wait_healthy()
