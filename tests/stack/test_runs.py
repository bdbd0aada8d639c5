"""Runs (docs/api.md, "Runs"): sessions whose turns the program drives to their end, who answers
their confirms, what a person may do while one drives, a workspace's check, the stack's bound on
run turns at once, on a stack of two runners.

The stack's hard tool-call limit is low (3) so a turn of a run can end unfinished at will; ``touch``
is not a read-only command, so the rules judge refuses it and (supervised) a person is asked; a
write to ``Makefile`` is a security confirm.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.checks import calls_closed, of_type, one, seqs_rise
from tests.support.stack import OTHER_TOKEN, Api, Stack, script, stack_fixture, tool

MAX_ACTIVE = 2
CONFIG = f"""
[limits]
tool_calls = 3

[runs]
max_active = {MAX_ACTIVE}
"""

stack = stack_fixture("runs", runners=2, config=CONFIG)


def start(api: Api, text: str, status: int = 201, **body: Any) -> dict[str, Any]:
    r = api.http.post("/v1/runs", json={"text": text, **body})
    assert r.status_code == status, r.text
    return dict(r.json())


def run_end(api: Api, sid: str, timeout: float = 60.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Wait for the run's ``run.end`` and the session to go idle: the end and the whole log."""
    end = api.wait_type(sid, "run.end", timeout=timeout)
    api.wait_idle(sid, timeout=timeout)
    evs = api.all_events(sid)
    calls_closed(evs)
    seqs_rise(evs)
    return end, evs


def answer(api: Api, sid: str, aid: str, decision: str) -> None:
    r = api.http.post(f"/v1/sessions/{sid}/approvals/{aid}", json={"decision": decision})
    assert r.status_code == 200, r.text


def touching(path: str, *then: dict[str, Any]) -> str:
    return script({"text": "Touching.", "tools": [tool("run_command", command=f"touch {path}")]}, *then)


# ------------------------------------------------------------------ who answers a run's confirms

def test_a_supervised_run_waits_for_the_person_and_goes_on_after_allow(stack: Stack, api: Api) -> None:
    run = start(api, touching("made.txt", {"text": "Touched it."}), workspace="run-supervised")
    sid = run["session_id"]
    assert run["run"] == {"state": "running", "confirm": "person", "unattended": False, "max_turns": 10, "turns": 1,
                          "outcome": None}
    pending = api.wait_type(sid, "approval.pending")
    time.sleep(1.0)  # nothing answers it but the person
    s = api.session(sid)
    assert s["busy"] and s["run"]["state"] == "running"
    assert [a["approval_id"] for a in s["approvals"]] == [pending["approval_id"]]
    answer(api, sid, pending["approval_id"], "allow")
    end, evs = run_end(api, sid)
    assert end["outcome"] == "completed" and end["turns"] == 1
    assert (Path(run["workspace"]) / "made.txt").exists()
    assert one(evs, "approval.resolved")["actor"] == "person"
    start_ev = one(evs, "run.start")
    assert (start_ev["confirm"], start_ev["unattended"], start_ev["max_turns"]) == ("person", False, 10)
    assert start_ev["seq"] < one(evs, "user.msg")["seq"] < one(evs, "turn.start")["seq"]
    assert one(evs, "turn.end")["seq"] < end["seq"]
    s = api.session(sid)
    assert s["run"] == {**run["run"], "state": "ended", "outcome": "completed"}


def test_an_unattended_run_declines_what_needs_a_person_the_model_sees_why_and_the_run_ends(
        stack: Stack, api: Api) -> None:
    run = start(api, touching("never.txt", {"text": "I could not touch it."}), workspace="run-unattended",
                unattended=True)
    sid = run["session_id"]
    end, evs = run_end(api, sid)
    assert end["outcome"] == "completed"
    pending = one(evs, "approval.pending")
    resolved = one(evs, "approval.resolved")
    assert resolved["approval_id"] == pending["approval_id"]
    assert (resolved["actor"], resolved["decision"], resolved["reason"]) == ("run", "deny", "unattended")
    result = one(evs, "tool.result", call_id=pending["call_id"])
    assert result["ok"] is False and "unattended" in result["output"], "the model is told why"
    assert not (Path(run["workspace"]) / "never.txt").exists()
    assert of_type(evs, "assistant.msg")[-1]["text"] == "I could not touch it."
    assert api.session(sid)["approvals"] == []


def test_an_unattended_yolo_run_allows_an_ordinary_confirm_and_declines_a_security_one(
        stack: Stack, api: Api) -> None:
    text = script({"tools": [tool("run_command", command="touch yolo.txt")]},
                  {"tools": [tool("write_file", path="Makefile", content="all:\n")]},
                  {"text": "Done."})
    run = start(api, text, workspace="run-yolo", confirm="yolo", unattended=True)
    sid, ws = run["session_id"], Path(run["workspace"])
    end, evs = run_end(api, sid)
    assert end["outcome"] == "completed"
    assert (ws / "yolo.txt").exists(), "the ordinary confirm was allowed"
    touch = of_type(evs, "tool.call")[0]
    allowed = [e for e in of_type(evs, "policy.decision") if e["call_id"] == touch["call_id"]][-1]
    assert (allowed["verdict"], allowed["actor"]) == ("allow", "run")
    pending = one(evs, "approval.pending")
    assert pending["security"] is True and pending["name"] == "write_file"
    resolved = one(evs, "approval.resolved")
    assert (resolved["actor"], resolved["decision"], resolved["reason"]) == ("run", "deny", "unattended")
    assert not (ws / "Makefile").exists(), "yolo never allows a security confirm"


def test_a_supervised_yolo_run_allows_an_ordinary_confirm_and_the_security_one_waits(stack: Stack, api: Api) -> None:
    text = script({"tools": [tool("run_command", command="touch y.txt")]},
                  {"tools": [tool("write_file", path="Makefile", content="all:\n")]},
                  {"text": "Done."})
    run = start(api, text, workspace="run-yolo-supervised", confirm="yolo")
    sid, ws = run["session_id"], Path(run["workspace"])
    pending = api.wait_type(sid, "approval.pending")
    assert pending["security"] is True and pending["name"] == "write_file"
    assert (ws / "y.txt").exists()
    time.sleep(1.0)
    assert api.session(sid)["approvals"][0]["approval_id"] == pending["approval_id"], "it waits for the person"
    answer(api, sid, pending["approval_id"], "allow")
    end, _ = run_end(api, sid)
    assert end["outcome"] == "completed"
    assert (ws / "Makefile").read_text() == "all:\n"


def test_a_judge_run_declines_what_the_judge_refuses_without_asking(stack: Stack, api: Api) -> None:
    text = script({"tools": [tool("run_command", command="ls"), tool("run_command", command="touch j.txt")]},
                  {"text": "Done."})
    run = start(api, text, workspace="run-judge", confirm="judge")
    sid, ws = run["session_id"], Path(run["workspace"])
    end, evs = run_end(api, sid)
    assert end["outcome"] == "completed"
    assert not of_type(evs, "approval.pending"), "nobody was asked"
    ls, touch = of_type(evs, "tool.call")
    assert one(evs, "tool.result", call_id=ls["call_id"])["ok"] is True
    refused = one(evs, "tool.result", call_id=touch["call_id"])
    assert refused["ok"] is False and "judge" in refused["output"]
    assert not (ws / "j.txt").exists()


# ------------------------------------------------------------------ continuing

def test_a_turn_that_hits_a_hard_limit_continues_with_its_plan_and_completes_in_turn_2(
        stack: Stack, api: Api) -> None:
    text = script({"tools": [tool("plan_write", steps=["look", "look again", "report"]), tool("plan_step", step=1),
                             tool("find_files", pattern="*.a"), tool("find_files", pattern="*.b")]},
                  {"tools": [tool("plan_step", step=2)]},
                  {"text": "Reported."})
    run = start(api, text, workspace="run-continue")
    sid = run["session_id"]
    end, evs = run_end(api, sid)
    assert (end["outcome"], end["turns"]) == ("completed", 2)
    first, second = of_type(evs, "turn.end")
    assert first["outcome"] == "hard_budget" and second["outcome"] == "completed"
    cont = [e for e in of_type(evs, "user.msg") if e["via"] == "run"]
    assert [c["text"] for c in cont] == ["continue"]
    assert first["seq"] < cont[0]["seq"] < second["seq"]
    carried = one(evs, "plan.carried")
    assert carried["seq"] > cont[0]["seq"] and carried["turn_id"] == second["turn_id"]
    assert api.session(sid)["run"]["turns"] == 2


def test_max_turns_ends_the_run(stack: Stack, api: Api) -> None:
    # every call a different one: the progress guard (same call, same result) never ends a turn first
    steps = [{"tools": [tool("find_files", pattern=f"*{t}{i}") for i in range(4)]} for t in range(5)]
    run = start(api, script(*steps), workspace="run-max", max_turns=2)
    sid = run["session_id"]
    end, evs = run_end(api, sid)
    assert (end["outcome"], end["turns"]) == ("max_turns", 2)
    assert [e["outcome"] for e in of_type(evs, "turn.end")] == ["hard_budget", "hard_budget"]
    assert len([e for e in of_type(evs, "user.msg") if e["via"] == "run"]) == 1
    assert api.session(sid)["run"]["outcome"] == "max_turns"


# ------------------------------------------------------------------ a person while a run drives

SLOW = script({"text": "Working slowly on it.", "delay_ms": 60_000})
LEADABLE = script({"text": "Working on it.", "delay_ms": 4000})
"""A first response slow enough to send to while it streams; a Lead saved meanwhile applies after it."""


def test_send_queue_and_steer_answer_run_active_stop_ends_the_run_and_a_send_goes_on(stack: Stack, api: Api) -> None:
    run = start(api, LEADABLE, workspace="run-stop")
    sid = run["session_id"]
    api.wait_type(sid, "assistant.delta")
    before = api.session(sid)["last_seq"]
    for mode in (None, "queue", "steer"):
        r = api.send(sid, "hello", mode)
        assert r.status_code == 409 and r.json()["error"] == "run_active", (mode, r.text)
    assert api.session(sid)["last_seq"] == before, "nothing recorded"
    r = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": script({"text": "Led."})})
    assert r.status_code == 202, "a supervised run takes a Lead"
    api.wait_type(sid, "lead.applied")
    assert api.wait_type(sid, "run.end")["outcome"] == "completed"
    assert of_type(api.all_events(sid), "assistant.msg")[-1]["text"] == "Led."

    run2 = start(api, SLOW, workspace="run-stop-2", unattended=True)
    sid2 = run2["session_id"]
    api.wait_type(sid2, "turn.start")
    r = api.http.post(f"/v1/sessions/{sid2}/lead", json={"text": "look here"})
    assert r.status_code == 409 and r.json()["error"] == "run_active"
    r = api.http.post(f"/v1/sessions/{sid2}/stop")
    assert r.status_code == 200, r.text
    end, evs = run_end(api, sid2)
    assert end["outcome"] == "stopped"
    assert one(evs, "turn.end")["outcome"] == "stopped"
    assert api.session(sid2)["run"]["state"] == "ended"
    r = api.send(sid2, "what now?")
    assert r.status_code == 202 and r.json()["disposition"] == "started", r.text
    api.wait_idle(sid2, timeout=30)
    evs = api.all_events(sid2)
    assert of_type(evs, "turn.end")[-1]["outcome"] == "completed"
    assert len(of_type(evs, "run.end")) == 1, "an ordinary turn after the run"
    assert of_type(evs, "user.msg")[-1]["via"] == "send"


# ------------------------------------------------------------------ templates, listing, checks

def test_a_template_run_works_in_a_fresh_copy(stack: Stack, api: Api) -> None:
    tpl = Path(api.create("tpl")["workspace"])
    (tpl / "task.txt").write_text("the task\n")
    (tpl / "sub").mkdir()
    (tpl / "sub" / "b.txt").write_text("b")
    one_ = start(api, script({"tools": [tool("write_file", path="out.txt", content="1")]}, {"text": "ok"}),
                 template="tpl")
    two = start(api, script({"text": "ok"}), template="tpl")
    ws1, ws2 = Path(one_["workspace"]), Path(two["workspace"])
    assert (ws1.name, ws2.name) == ("tpl-run-1", "tpl-run-2") and ws1.parent == tpl.parent
    assert (ws1 / "task.txt").read_text() == "the task\n" and (ws2 / "sub" / "b.txt").read_text() == "b"
    run_end(api, one_["session_id"])
    run_end(api, two["session_id"])
    assert (ws1 / "out.txt").exists() and not (tpl / "out.txt").exists() and not (ws2 / "out.txt").exists()
    assert api.session(one_["session_id"])["workspace"] == str(ws1)
    with Api(stack.url, OTHER_TOKEN) as other:
        r = other.http.post("/v1/runs", json={"template": "tpl", "text": "x"})
        assert r.status_code == 404 and r.json()["error"] == "not_found", "another principal's template"


def test_concurrent_posts_with_one_client_id_make_one_run(stack: Stack, api: Api) -> None:
    """Four POSTs of one client_id at once, over both runners, make one session (one 201, the
    others 200 ``replay`` with the same body shape); the copies the losers made are gone; a later
    POST with it is a replay of the run as it is now; another principal's same client_id is theirs."""
    tpl = Path(api.create("tpl-cid")["workspace"])
    (tpl / "task.txt").write_text("t\n")
    text = script({"delay_ms": 300, "text": "ok"})
    headers = dict(api.http.headers)
    rounds = [f"cid-{n}" for n in range(4)]
    for cid in rounds:
        clients = [httpx.Client(base_url=stack.url, headers=headers, timeout=60) for _ in range(4)]
        try:
            barrier = threading.Barrier(len(clients))

            def post(c: httpx.Client, cid: str = cid, barrier: threading.Barrier = barrier) -> httpx.Response:
                barrier.wait()
                return c.post("/v1/runs", json={"text": text, "template": "tpl-cid", "client_id": cid,
                                                "confirm": "yolo", "unattended": True})

            with ThreadPoolExecutor(len(clients)) as pool:
                replies = list(pool.map(post, clients))
        finally:
            for c in clients:
                c.close()
        assert sorted(r.status_code for r in replies) == [200, 200, 200, 201], [r.text for r in replies]
        bodies = [r.json() for r in replies]
        assert len({b["session_id"] for b in bodies}) == 1, bodies
        assert all(set(b) == {"session_id", "workspace", "run", "replay"} for b in bodies), bodies
        assert [b["replay"] for b in bodies if b["replay"] is False] == [False], "one made it"
        assert len({b["workspace"] for b in bodies}) == 1
    made = {r["session_id"] for r in (start(api, text, 200, template="tpl-cid", client_id=c) for c in rounds)}
    assert len(made) == len(rounds)
    copies = sorted(p.name for p in tpl.parent.iterdir() if p.name.startswith("tpl-cid-run-"))
    assert len(copies) == len(rounds), f"the losers' copies are removed: {copies}"
    runs = [x for x in api.http.get("/v1/runs").json()["runs"] if Path(x["workspace"]).name in copies]
    assert {x["id"] for x in runs} == made and len(runs) == len(rounds), "one session per client_id"
    for sid in made:
        end, evs = run_end(api, sid)
        assert end["outcome"] == "completed" and len(of_type(evs, "run.start")) == 1
        assert len(of_type(evs, "user.msg")) == 1, "nothing sent twice"
    again = start(api, text, 200, template="tpl-cid", client_id=rounds[0])
    assert again["replay"] is True and again["run"]["state"] == "ended", "the run as it is now"
    with Api(stack.url, OTHER_TOKEN) as other:
        mine = start(other, script({"text": "ok"}), workspace="cid-theirs", client_id=rounds[0])
        assert mine["replay"] is False and mine["session_id"] not in made
    for bad in ("", "a" * 65, "no spaces", "a/b"):
        r = api.http.post("/v1/runs", json={"text": "x", "workspace": "cid-bad", "client_id": bad})
        assert (r.status_code, r.json()["error"]) == (422, "invalid"), (bad, r.text)


def test_bad_run_requests_are_refused_and_create_nothing(stack: Stack, api: Api) -> None:
    before = {p.name for p in stack.root.iterdir()}
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"text": "x"}, 422, "invalid"),
        ({"text": "x", "workspace": "a", "template": "tpl"}, 422, "invalid"),
        ({"text": "x", "template": "no-such-template"}, 404, "not_found"),
        ({"text": "x", "workspace": "nope", "create": False}, 404, "not_found"),
        ({"text": "x", "workspace": "b", "max_turns": 0}, 422, "invalid"),
        ({"text": "x", "workspace": "b", "max_turns": 1001}, 422, "invalid"),
        ({"text": "x", "workspace": "b", "confirm": "always"}, 422, "invalid"),
        ({"text": "", "workspace": "b"}, 422, "invalid"),
        ({"text": "x", "workspace": "b", "model": "no-such-model"}, 422, "invalid"),
        ({"text": "x", "workspace": "b", "bogus": 1}, 422, "invalid"),
        ({"text": "x", "workspace": "."}, 422, "workspace_invalid"),
    ]
    for body, status, code in cases:
        r = api.http.post("/v1/runs", json=body)
        assert (r.status_code, r.json()["error"]) == (status, code), (body, r.text)
    assert {p.name for p in stack.root.iterdir()} == before


def test_runs_lists_the_principals_runs_by_state(stack: Stack, api: Api) -> None:
    chat = api.create("runs-list-chat")["id"]
    done = start(api, script({"text": "ok"}), workspace="runs-list-a")["session_id"]
    run_end(api, done)
    slow = start(api, SLOW, workspace="runs-list-b")["session_id"]
    api.wait_type(slow, "turn.start")
    with Api(stack.url, OTHER_TOKEN) as other:
        theirs = start(other, script({"text": "ok"}), workspace="runs-list-theirs")["session_id"]
        # (their runs of other tests are on other workspaces)
        assert [x["id"] for x in other.http.get("/v1/runs").json()["runs"]
                if Path(x["workspace"]).name.startswith("runs-list-")] == [theirs]

    def ids(state: str | None = None) -> list[str]:
        r = api.http.get("/v1/runs", params={"state": state} if state else {})
        assert r.status_code == 200, r.text
        runs = r.json()["runs"]
        assert all(x["run"] is not None for x in runs)
        return [x["id"] for x in runs]

    assert done in ids("ended") and slow not in ids("ended")
    assert slow in ids("running") and done not in ids("running")
    every = ids()
    assert every.index(slow) < every.index(done), "newest first"
    assert chat not in every and theirs not in every
    assert api.session(chat)["run"] is None
    assert api.http.get("/v1/runs", params={"state": "paused"}).status_code == 422
    api.http.post(f"/v1/sessions/{slow}/stop")
    assert api.wait_type(slow, "run.end")["outcome"] == "stopped"


def test_a_check_runs_in_the_sandbox_after_the_run_and_is_recorded(stack: Stack, api: Api) -> None:
    run = start(api, script({"tools": [tool("write_file", path="answer.txt", content="42\n")]}, {"text": "ok"}),
                workspace="run-check")
    sid = run["session_id"]

    def check(command: str, **kw: Any) -> httpx.Response:
        return api.http.post(f"/v1/sessions/{sid}/check", json={"command": command, **kw}, timeout=60)

    run_end(api, sid)
    r = check("grep -qx 42 answer.txt && echo pass")
    assert r.status_code == 200, r.text
    assert r.json()["exit_code"] == 0 and "pass" in r.json()["output"]
    r = check("cat answer.txt; exit 3")
    assert r.json()["exit_code"] == 3 and "42" in r.json()["output"]
    # confined as the model's commands are: the stack's own files beside the workspaces are not there
    outside = stack.tmp / "coxswain.toml"
    assert outside.exists()
    assert check(f"test -e {outside}").json()["exit_code"] == 1
    r = check("sleep 30", timeout_s=1)
    assert r.status_code == 200 and r.json()["exit_code"] is None
    checks = of_type(api.all_events(sid), "check")
    assert [(c["command"], c["exit_code"]) for c in checks] == [
        ("grep -qx 42 answer.txt && echo pass", 0), ("cat answer.txt; exit 3", 3),
        (f"test -e {outside}", 1), ("sleep 30", None)]
    assert not api.session(sid)["busy"]

    busy = start(api, SLOW, workspace="run-check-busy")["session_id"]
    api.wait_type(busy, "turn.start")
    r = api.http.post(f"/v1/sessions/{busy}/check", json={"command": "true"})
    assert r.status_code == 409 and r.json()["error"] == "busy", r.text
    assert not of_type(api.all_events(busy), "check")
    assert api.http.post(f"/v1/sessions/{busy}/check", json={"command": ""}).status_code == 422
    with Api(stack.url, OTHER_TOKEN) as other:
        assert other.http.post(f"/v1/sessions/{sid}/check", json={"command": "true"}).status_code == 404
    api.http.post(f"/v1/sessions/{busy}/stop")
    api.wait_type(busy, "run.end")


# ------------------------------------------------------------------ the stack's bound, and people first

def _working(evs: list[dict[str, Any]]) -> tuple[int, int]:
    """When a run turn did work: its first model output to its end (ms, Redis clock)."""
    first = next(e for e in evs if e["type"] == "assistant.delta")
    return first["ts"], one(evs, "turn.end")["ts"]


@pytest.mark.serial  # bounds how long the person's turn takes: alone, not beside other stacks
def test_max_active_bounds_the_run_turns_at_once_and_a_person_is_not_kept_waiting(stack: Stack, api: Api) -> None:
    n = 5
    slow = script({"text": "one two three four five six", "delay_ms": 1500})
    sids = [start(api, slow, workspace=f"run-bound-{i}")["session_id"] for i in range(n)]
    api.wait_type(sids[0], "assistant.delta", timeout=30)
    chat = api.create("run-bound-person")["id"]
    t0 = time.monotonic()
    r = api.send(chat, "hello")
    assert r.status_code == 202 and r.json()["disposition"] == "started"
    api.wait_type(chat, "turn.end", outcome="completed", timeout=30)
    took = time.monotonic() - t0
    spans = []
    for sid in sids:
        end, evs = run_end(api, sid, timeout=90)
        assert end["outcome"] == "completed"
        spans.append(_working(evs))
    at_once = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert at_once <= MAX_ACTIVE, spans
    assert at_once == MAX_ACTIVE, "the bound is used"
    assert took < 1.5, f"the person's turn waited {took:.2f}s behind run turns"
    health = stack.redis_client()
    try:
        assert health.zcard("cox:{runs}:slots") == 0, "every slot was given back"
    finally:
        health.close()
