"""The turn loop through the HTTP API — respond, observe, finish reasons, the progress
guard, no round cap, titles and plans (docs/design.md, "The turn loop")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checks import finished, holder, last_seq, of_type, one, seqs_rise
from tests.support.flow import answer, next_approval
from tests.support.stack import OTHER_TOKEN, Api, Stack, script, tool

# ---------------------------------------------------------------- respond and observe


def test_respond_tells_the_person_and_the_turn_goes_on(stack: Stack, api: Api) -> None:
    s = api.create("respond")
    sid = s["id"]
    api.send(sid, script({"tools": [tool("respond", text="Halfway: the tests pass.")]}, {"text": "All done."}))
    end, evs = finished(api, sid)
    assert one(evs, "agent.message")["text"] == "Halfway: the tests pass."
    assert one(evs, "tool.result")["ok"] is True
    assert of_type(evs, "assistant.msg")[-1]["text"] == "All done."
    assert end["outcome"] == "completed"


def test_observe_folds_the_output_into_the_next_tool_result(stack: Stack, api: Api) -> None:
    s = api.create("observe")
    sid = s["id"]
    # The first command runs until the observation is recorded (the POST answers once it is):
    # a fixed 1.5 s one ended first on a loaded CI machine, and the output went to the next result.
    api.send(sid, script(
        {"tools": [tool("run_command", command="for i in $(seq 600); do [ -e go ] && exit 0; sleep 0.05; done; exit 1")]},
        {"tools": [tool("run_command", command="echo second")]},
        {"text": "Done."},
    ))
    call = api.wait_type(sid, "tool.call")
    pending = next_approval(api, sid)  # a loop is not among the commands allowed without asking
    answer(api, sid, pending["approval_id"], "allow")
    r = api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "echo observed-fact"})
    assert r.status_code == 202, r.text
    (Path(s["workspace"]) / "go").write_text("")
    _, evs = finished(api, sid)
    observed = one(evs, "observed")
    assert observed["command"] == "echo observed-fact" and "observed-fact" in observed["output"]
    assert observed["turn_id"] == call["turn_id"]
    results = of_type(evs, "tool.result")
    assert results[0]["call_id"] == call["call_id"] and results[0]["seq"] > observed["seq"]
    assert results[0]["observed"] == [{"command": "echo observed-fact", "output": observed["output"]}]
    assert "observed-fact" not in results[0]["output"], "the command's own output stays its own"
    assert results[1]["observed"] is None, "folded once"
    assert not [e for e in of_type(evs, "user.msg") if e["seq"] > observed["seq"]], "an observed fact, not a user message"

    # While idle: kept for the next tool result the model reads, in the next turn.
    r = api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "printf idle-fact"})
    assert r.status_code == 202
    with stack.client(OTHER_TOKEN) as other:
        assert other.http.post(f"/v1/sessions/{sid}/observe", json={"command": "true"}).status_code == 404
    after = last_seq(api, sid)
    api.send(sid, script({"text": "no tools yet"}))
    finished(api, sid, after=after)
    after = last_seq(api, sid)
    api.send(sid, script({"tools": [tool("list_dir", path=".")]}, {"text": "ok"}))
    _, evs = finished(api, sid, after=after)
    result = next(e for e in of_type(evs, "tool.result") if e["seq"] > after)
    assert result["observed"] and "idle-fact" in result["observed"][0]["output"]


def test_a_read_step_is_recorded_in_order_with_its_response(stack: Stack, api: Api) -> None:
    """A response whose first call is a read is recorded with that read (one Redis call): the log
    still reads usage, the response, then each call's start, decision and result, without a gap."""
    s = api.create("read-steps", title="read steps")
    sid = s["id"]
    (Path(s["workspace"]) / "a.txt").write_text("alpha")
    api.send(sid, script({"text": "reading", "tools": [tool("read_file", path="a.txt"), tool("list_dir", path=".")]},
                         {"tools": [tool("find_files", pattern="*.txt")]},
                         {"tools": [tool("write_file", path="b.txt", content="beta")]},
                         {"text": "Done."}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    seqs_rise(evs)
    steps = of_type(evs, "assistant.msg")
    assert len(steps) == 4
    for msg in steps[:2]:  # the read steps (a write's result comes after its version.kept)
        at = evs.index(msg)
        assert evs[at - 1]["type"] == "usage" and evs[at - 1]["seq"] == msg["seq"] - 1
        expect: list[str] = []
        for _ in msg["tool_calls"]:
            expect += ["tool.call", "policy.decision", "tool.result"]
        got = evs[at + 1:at + 1 + len(expect)]
        assert [e["type"] for e in got] == expect, [e["type"] for e in got]
        assert [e["seq"] for e in got] == list(range(msg["seq"] + 1, msg["seq"] + 1 + len(expect)))
        assert [e["call_id"] for e in got[::3]] == [c["call_id"] for c in msg["tool_calls"]]
    write = one(evs, "tool.call", name="write_file")
    assert evs[evs.index(write) - 1] is steps[2], "a write's call follows its response in the log"
    results = of_type(evs, "tool.result")
    assert all(r["ok"] for r in results) and "alpha" in results[0]["output"]
    assert (Path(s["workspace"]) / "b.txt").read_text() == "beta"


# ---------------------------------------------------------------- finish reasons


def test_a_truncated_response_runs_none_of_its_calls(stack: Stack, api: Api) -> None:
    s = api.create("length")
    sid = s["id"]
    api.send(sid, script({"text": "I will write", "finish": "length",
                          "tools": [tool("write_file", path="t.txt", content="t"), tool("list_dir", path=".")]}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "output_limit" and end["finish_reason"] == "length"
    assert end["provider_finish_reason"] == "length"
    assert one(evs, "assistant.msg")["finish_reason"] == "length"
    assert [e["reason"] for e in of_type(evs, "tool.skipped")] == ["truncated", "truncated"]
    assert not of_type(evs, "tool.call", "tool.result")
    assert not (Path(s["workspace"]) / "t.txt").exists()


def test_an_empty_final_answer_is_surfaced(stack: Stack, api: Api) -> None:
    s = api.create("empty")
    sid = s["id"]
    api.send(sid, script({"tools": [tool("list_dir", path=".")]}, {}))
    end, _ = finished(api, sid)
    assert end["outcome"] == "empty" and end["detail"]


def test_one_malformed_call_gets_a_retry_and_a_second_ends_the_turn(stack: Stack, api: Api) -> None:
    s = api.create("malformed")
    sid = s["id"]
    api.send(sid, script({"malformed": True, "tools": [tool("read_file", path="x")]},
                         {"tools": [tool("list_dir", path=".")]}, {"text": "Recovered."}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    bad = of_type(evs, "tool.result")[0]
    assert bad["ok"] is False and "malformed" in bad["output"]

    after = last_seq(api, sid)
    api.send(sid, script({"malformed": True, "tools": [tool("read_file", path="x")]},
                         {"malformed": True, "tools": [tool("read_file", path="y")]}, {"text": "not reached"}))
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "error" and "malformed" in end["detail"]


def test_there_is_no_response_round_cap(stack: Stack, api: Api) -> None:
    s = api.create("rounds")
    sid = s["id"]
    steps = [{"tools": [tool("respond", text=f"step {i}")]} for i in range(20)]
    api.send(sid, script(*steps, {"text": "Finished all twenty."}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert len(of_type(evs, "assistant.msg")) == 21 and len(of_type(evs, "agent.message")) == 20


def test_the_progress_guard_ends_a_stuck_turn(stack: Stack, api: Api) -> None:
    s = api.create("stuck")
    sid = s["id"]
    api.send(sid, script(*[{"tools": [tool("list_dir", path=".")]} for _ in range(6)], {"text": "not reached"}))
    end, evs = finished(api, sid)
    assert end["outcome"] == "stuck"
    assert len(of_type(evs, "tool.result")) == 3


# ---------------------------------------------------------------- titles


def test_title_comes_after_the_first_usable_response_and_before_its_tools(stack: Stack, api: Api) -> None:
    s = api.create("title")
    sid = s["id"]
    assert s["title"] is None and s["title_source"] is None
    api.send(sid, "please fix the login bug in auth.py now\n" + script(
        {"text": "Looking.", "tools": [tool("list_dir", path=".")]}, {"text": "Done."}, text=""))
    _, evs = finished(api, sid)
    title = one(evs, "title.set")
    assert title["title"] == "please fix the login bug" and title["source"] == "auto"
    first = of_type(evs, "assistant.msg")[0]
    assert first["seq"] < title["seq"] < one(evs, "tool.call")["seq"]
    sess = api.session(sid)
    assert sess["title"] == "please fix the login bug" and sess["title_source"] == "auto"

    after = last_seq(api, sid)
    api.send(sid, "a second message that names nothing")
    _, evs = finished(api, sid, after=after)
    assert len(of_type(evs, "title.set")) == 1, "named once"


def test_a_first_turn_that_asks_for_no_call_ends_with_its_titles_usage_in_one_record(stack: Stack, api: Api) -> None:
    """The title's usage is not recorded on its own: the turn's end records it (and closes Lead
    admission with it), as a later turn's end records its final response."""
    s = api.create("title-end")
    sid = s["id"]
    api.send(sid, "name this session for me\n" + script({"text": "Done."}, text=""))
    end, evs = finished(api, sid)
    title = one(evs, "title.set")
    usage = [e for e in of_type(evs, "usage") if e["purpose"] == "title"]
    assert len(usage) == 1
    assert of_type(evs, "assistant.msg")[0]["seq"] < title["seq"] < usage[0]["seq"] == end["seq"] - 1
    assert end["outcome"] == "completed"
    late = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": "too late"})
    assert late.status_code == 409 and late.json()["error"] == "no_turn", late.text


def test_title_after_the_first_tool_round_when_the_response_had_only_calls(stack: Stack, api: Api) -> None:
    s = api.create("title-tools")
    sid = s["id"]
    api.send(sid, "only tools at first\n" + script({"tools": [tool("list_dir", path=".")]},
                                                   {"text": "Done."}, text=""))
    _, evs = finished(api, sid)
    title = one(evs, "title.set")
    assert title["title"] == "only tools at first"
    assert one(evs, "tool.result")["seq"] < title["seq"] < of_type(evs, "assistant.msg")[1]["seq"]


def test_a_manual_rename_is_never_overwritten(stack: Stack, api: Api) -> None:
    named = api.create("title-manual", title="My own name")
    api.send(named["id"], "words that would make a title")
    _, evs = finished(api, named["id"])
    assert not [e for e in of_type(evs, "title.set") if e["source"] == "auto"]
    assert api.session(named["id"])["title"] == "My own name"

    s = api.create("title-rename")
    sid = s["id"]
    api.send(sid, "some request to be named\n" + script({"text": "Slow thinking.", "delay_ms": 1500}, text=""))
    api.wait_type(sid, "turn.start")
    r = api.http.patch(f"/v1/sessions/{sid}", json={"title": "Renamed while running"})
    assert r.status_code == 200 and r.json()["title_source"] == "manual"
    _, evs = finished(api, sid)
    assert [e["source"] for e in of_type(evs, "title.set")] == ["manual"]
    sess = api.session(sid)
    assert sess["title"] == "Renamed while running" and sess["title_source"] == "manual"


def test_auto_title_off_is_respected(stack: Stack, api: Api) -> None:
    s = api.create("title-off")
    sid = s["id"]
    r = api.http.patch(f"/v1/sessions/{sid}", json={"auto_title": False})
    assert r.status_code == 200 and r.json()["auto_title"] is False
    api.send(sid, "this would otherwise be the title")
    _, evs = finished(api, sid)
    assert not of_type(evs, "title.set")
    assert api.session(sid)["title"] is None


# ---------------------------------------------------------------- plans


PLAN = [tool("plan_write", steps=["read", "change", "test"])]


def test_a_completed_turn_carries_no_plan(stack: Stack, api: Api) -> None:
    s = api.create("plan-done")
    sid = s["id"]
    api.send(sid, script({"tools": PLAN}, {"tools": [tool("plan_step", step=1)]}, {"text": "Done."}))
    _, evs = finished(api, sid)
    assert one(evs, "plan.write")["steps"] == ["read", "change", "test"]
    assert one(evs, "plan.step")["step"] == 1
    assert api.session(sid)["plan"] is None
    after = last_seq(api, sid)
    api.send(sid, "next request")
    _, evs = finished(api, sid, after=after)
    assert not of_type(evs, "plan.carried")


def test_a_stopped_turn_carries_its_plan_with_its_marks(stack: Stack, api: Api) -> None:
    s = api.create("plan-stop")
    sid = s["id"]
    api.send(sid, script({"tools": PLAN}, {"tools": [tool("plan_step", step=1)]},
                         {"tools": [tool("run_command", command="sleep 10")]}))
    first = api.wait_type(sid, "tool.call", name="run_command")
    api.http.post(f"/v1/sessions/{sid}/stop")
    end, _ = finished(api, sid)
    assert end["outcome"] == "stopped"
    assert api.session(sid)["plan"]["marks"] == [1]

    after = last_seq(api, sid)
    api.send(sid, script({"tools": [tool("plan_step", step=2)]}, {"text": "Carried on."}, text="continue"))
    end, evs = finished(api, sid, after=after)
    carried = one(evs, "plan.carried")
    assert carried["from_turn"] == first["turn_id"]
    assert carried["steps"] == ["read", "change", "test"] and carried["marks"] == [1]
    step = next(e for e in of_type(evs, "tool.result") if e["seq"] > after)
    assert step["ok"] is True, "plan_step goes on with the carried plan"
    assert end["outcome"] == "completed" and api.session(sid)["plan"] is None


def test_a_fully_marked_plan_is_not_carried(stack: Stack, api: Api) -> None:
    s = api.create("plan-marked")
    sid = s["id"]
    api.send(sid, script({"tools": [tool("plan_write", steps=["only"])]}, {"tools": [tool("plan_step", step=1)]},
                         {"tools": [tool("run_command", command="sleep 10")]}))
    api.wait_type(sid, "tool.call", name="run_command")
    api.http.post(f"/v1/sessions/{sid}/stop")
    finished(api, sid)
    after = last_seq(api, sid)
    api.send(sid, "next")
    _, evs = finished(api, sid, after=after)
    assert not of_type(evs, "plan.carried")


def test_an_error_carries_the_plan(stack: Stack, api: Api) -> None:
    s = api.create("plan-error")
    sid = s["id"]
    api.send(sid, script({"tools": PLAN}, {"malformed": True, "tools": [tool("read_file", path="x")]},
                         {"malformed": True, "tools": [tool("read_file", path="x")]}))
    end, _ = finished(api, sid)
    assert end["outcome"] == "error"
    after = last_seq(api, sid)
    api.send(sid, "go on")
    _, evs = finished(api, sid, after=after)
    assert one(evs, "plan.carried")["marks"] == []


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
@pytest.mark.slow
def test_a_crashed_turn_carries_its_plan(stack: Stack, api: Api) -> None:
    s = api.create("plan-crash")
    sid = s["id"]
    api.send(sid, script({"tools": PLAN}, {"tools": [tool("plan_step", step=2)]},
                         {"tools": [tool("run_command", command="sleep 30")]}))
    call = api.wait_type(sid, "tool.call", name="run_command")
    victim = holder(stack, sid)
    stack.kill(victim)
    try:
        end = api.wait_type(sid, "turn.end", timeout=30)
        assert end["outcome"] == "crashed"
        api.wait_idle(sid)
        evs = api.all_events(sid)
        result = one(evs, "tool.result", call_id=call["call_id"])
        assert result["ok"] is False and "crashed" in result["output"]
        assert api.session(sid)["plan"]["marks"] == [2]
        after = last_seq(api, sid)
        api.send(sid, "pick it up")
        _, evs = finished(api, sid, after=after)
        carried = one(evs, "plan.carried")
        assert carried["marks"] == [2] and carried["from_turn"] == call["turn_id"]
    finally:
        stack.spawn(victim, "cox_runner")
        stack.wait_healthy()


def test_session_plan_is_visible_while_the_turn_runs(stack: Stack, api: Api) -> None:
    s = api.create("plan-view")
    sid = s["id"]
    api.send(sid, script({"tools": PLAN}, {"tools": [tool("run_command", command="sleep 5")]}))
    api.wait_type(sid, "tool.call", name="run_command")
    plan = api.session(sid)["plan"]
    assert plan["steps"] == ["read", "change", "test"] and plan["marks"] == []
    api.http.post(f"/v1/sessions/{sid}/stop")
    finished(api, sid)
    assert api.session(sid)["plan"]["steps"] == ["read", "change", "test"], "kept for the next turn"
