"""The judge: the model judge against a real local OpenAI-compatible HTTP server, the rules
judge, no judge, the don't-ask switch and standing approvals, through HTTP.

The canned server (started by this module on a free port, configured as a provider) answers
the judge's chat-completion requests according to the command it is shown: a good verdict, a
low score, a refusal, a malformed answer, or no answer in time. It records every request, so
tests can see what the judge was shown and whether it was asked at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.flow import (
    answer,
    call_ids,
    final_decision,
    next_approval,
    patch,
    respawn,
    result,
    run_turn,
)
from tests.support.stack import Api, Stack, script


class Canned:
    """A chat-completions endpoint with canned structured answers."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with canned.lock:
                    canned.requests.append(body)
                reply = canned.reply(body)
                if reply is None:
                    return
                data = json.dumps(reply).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the judge gave up waiting (the slow case)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    @staticmethod
    def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": "canned",
                "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}

    def reply(self, body: dict[str, Any]) -> dict[str, Any] | None:
        prompt = json.dumps(body["messages"])
        tool = body["tools"][0]["function"]["name"]

        def verdict(v: str, score: float, reason: str) -> dict[str, Any]:
            args = json.dumps({"verdict": v, "score": score, "reason": reason})
            return self._completion({"content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": args}}]}, "tool_calls")

        if "judge-slow" in prompt:
            time.sleep(6)
            return verdict("allow", 0.99, "too late")
        if "judge-malformed" in prompt:
            return self._completion({"content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": tool, "arguments": '{"verdict": "yes please", "score": "high"'}}]},
                "tool_calls")
        if "judge-refuse" in prompt:
            return verdict("refuse", 0.05, "it deletes the person's files, which the task does not ask for")
        if "judge-low" in prompt:
            return verdict("allow", 0.5, "probably fine")
        return verdict("allow", 0.95, "a harmless echo that serves the task")


@pytest.fixture(scope="module")
def canned() -> Iterator[Canned]:
    c = Canned()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Stack]:
    config = f"""
[approval]
writes = "ask"
commands = "judge"

[judge]
kind = "model"
model = "judge-canned"
approve_threshold = 0.8
timeout_s = 2

[[model.providers]]
name = "judge-canned"
kind = "openai"
base_url = "http://127.0.0.1:{canned.port}/v1"
model = "canned-judge"
"""
    s = Stack(tmp_path_factory.mktemp("judge"), runners=1, config=config)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def cmd(command: str) -> dict[str, Any]:
    return {"name": "run_command", "args": {"command": command}}


def one_command(api: Api, sid: str, command: str, task: str = "run the script") -> dict[str, Any]:
    """Send a one-command script; return the approval.pending it raises (the caller answers)."""
    seq = api.all_events(sid)[-1]["seq"]
    r = api.send(sid, script({"tools": [cmd(command)]}, {"text": "done"}, text=task))
    assert r.status_code == 202, r.text
    return next_approval(api, sid, after=seq)


# ------------------------------------------------------------------ the model judge


def test_the_model_judge_allows_and_is_shown_task_plan_and_call(stack: Stack, api: Api, canned: Canned) -> None:
    s = api.create("judge-allow")
    before = canned.count()
    evs = run_turn(api, s["id"], script(
        {"tools": [{"name": "plan_write", "args": {"steps": ["greet the reviewer", "finish"]}}]},
        {"tools": [cmd("echo judge-allow")]},
        {"text": "done"},
        text="Say hello to the code reviewer",
    ))
    cid = call_ids(evs, "run_command")[0]
    d = final_decision(evs, cid)
    assert (d["verdict"], d["actor"]) == ("allow", "judge") and "harmless echo" in d["reason"]
    assert result(evs, cid)["ok"] is True
    assert canned.count() == before + 1
    judged = [e for e in evs if e["type"] == "usage" and e["purpose"] == "judge"]
    assert len(judged) == 1 and judged[0]["input_tokens"] > 0, "the judge's request is a usage event"
    shown = json.dumps(canned.requests[-1]["messages"])
    assert "Say hello to the code reviewer" in shown and "greet the reviewer" in shown
    assert "echo judge-allow" in shown


@pytest.mark.parametrize(("command", "verdict", "expect"), [
    ("rm -rf src judge-refuse", "refuse", "the judge refused: it deletes the person's files"),
    ("echo judge-low", "refuse", "score 0.5 is below the threshold 0.8"),
    ("echo judge-malformed", "error", "not a valid verdict"),
    ("echo judge-slow", "error", "did not answer within 2s"),
])
def test_what_the_judge_does_not_allow_goes_to_the_person_with_what_it_said(
        stack: Stack, api: Api, command: str, verdict: str, expect: str) -> None:
    s = api.create("judge-ask")
    pending = one_command(api, s["id"], command)
    assert pending["security"] is False
    judge = pending["judge"]
    assert judge["kind"] == "model" and judge["verdict"] == verdict and expect in judge["reason"], judge
    if command.endswith("judge-malformed"):
        assert "yes please" in judge["said"], judge  # the person sees the raw answer
    if command.endswith("judge-low"):
        assert judge["score"] == 0.5 and judge["answer"] == "allow" and judge["threshold"] == 0.8
    # The session object shows the same to a client that was not listening to events.
    shown = api.session(s["id"])["approvals"]
    assert shown and shown[0]["judge"]["reason"] == judge["reason"]
    answer(api, s["id"], pending["approval_id"], "deny")
    api.wait_type(s["id"], "turn.end")
    evs = api.all_events(s["id"])
    cid = call_ids(evs, "run_command")[0]
    assert final_decision(evs, cid)["actor"] == "person"
    assert result(evs, cid)["ok"] is False


def test_dont_ask_answers_and_the_judge_is_not_asked(stack: Stack, api: Api, canned: Canned) -> None:
    s = api.create("judge-dont-ask")
    patch(api, s["id"], dont_ask=True)
    before = canned.count()
    evs = run_turn(api, s["id"], script({"tools": [cmd("echo judge-refuse would refuse this")]}, {"text": "ok"}))
    cid = call_ids(evs, "run_command")[0]
    d = final_decision(evs, cid)
    assert (d["verdict"], d["actor"]) == ("allow", "setting") and "don't-ask" in d["reason"]
    assert canned.count() == before, "the judge was asked while don't-ask was on"
    assert not [e for e in evs if e["type"] == "approval.pending"]


def test_always_this_session_makes_a_prefix_standing(stack: Stack, api: Api, canned: Canned) -> None:
    s = api.create("judge-standing")
    pending = one_command(api, s["id"], "echo judge-low first")
    answer(api, s["id"], pending["approval_id"], "allow", scope="session")
    api.wait_type(s["id"], "turn.end")
    before = canned.count()
    evs = run_turn(api, s["id"], script({"tools": [cmd("echo judge-low again")]}, {"text": "ok"}))
    d = final_decision(evs, call_ids(evs, "run_command")[0])
    assert (d["verdict"], d["actor"]) == ("allow", "standing")
    assert canned.count() == before


def test_writes_ask_brings_the_prompt_back_with_a_preview(stack: Stack, api: Api) -> None:
    s = api.create("writes-ask")
    ws = api.session(s["id"])["workspace"]
    with open(f"{ws}/a.txt", "w") as fh:
        fh.write("one\ntwo\nthree\n")
    r = api.send(s["id"], script({"tools": [{"name": "write_file", "args": {"path": "a.txt",
                                                                             "content": "one\n2\nthree\n"}}]},
                                 {"text": "ok"}))
    assert r.status_code == 202
    pending = next_approval(api, s["id"])
    assert pending["security"] is False and pending["reason"] == "writes = ask" and pending["judge"] is None
    p = pending["preview"]
    assert (p["added"], p["removed"], p["created"], p["oversized"]) == (1, 1, False, False)
    lines = [ln for h in p["hunks"] for ln in h["lines"]]
    assert {"op": "-", "old": 2, "new": None, "text": "two"} in lines
    assert {"op": "+", "old": None, "new": 2, "text": "2"} in lines
    answer(api, s["id"], pending["approval_id"], "allow", scope="session")
    api.wait_type(s["id"], "turn.end")
    with open(f"{ws}/a.txt") as fh:
        assert fh.read() == "one\n2\nthree\n"
    changes = api.http.get(f"/v1/sessions/{s['id']}/changes").json()["files"]
    assert [(c["path"], c["actor"], c["available"]) for c in changes] == [("a.txt", "person", True)]
    assert changes[0]["preview"] == p, "the preview the person approved"
    # "Always this session" makes that path's writes standing.
    evs = run_turn(api, s["id"], script({"tools": [{"name": "write_file", "args": {"path": "a.txt",
                                                                                    "content": "1\n"}}]},
                                        {"text": "ok"}))
    d = final_decision(evs, call_ids(evs, "write_file")[0])
    assert (d["verdict"], d["actor"]) == ("allow", "standing")
    # Don't-ask answers a write that writes = ask would put to the person.
    patch(api, s["id"], dont_ask=True)
    evs = run_turn(api, s["id"], script({"tools": [{"name": "write_file", "args": {"path": "b.txt",
                                                                                    "content": "b\n"}}]},
                                        {"text": "ok"}))
    d = final_decision(evs, call_ids(evs, "write_file")[0])
    assert (d["verdict"], d["actor"]) == ("allow", "setting")


# ------------------------------------------------------------------ rules and none (restarted judge)


def test_rules_judge_then_no_judge(stack: Stack, api: Api, canned: Canned) -> None:
    respawn(stack, ["guard", "judge"], {"COX_JUDGE__KIND": "rules"})
    s = api.create("judge-rules")
    before = canned.count()
    evs = run_turn(api, s["id"], script({"tools": [cmd("ls -la | wc -l")]}, {"text": "ok"}))
    d = final_decision(evs, call_ids(evs, "run_command")[0])
    assert (d["verdict"], d["actor"]) == ("allow", "judge")
    pending = one_command(api, s["id"], "rm -rf build")
    assert pending["judge"]["kind"] == "rules" and "'rm' is not a known read-only command" in pending["judge"]["reason"]
    answer(api, s["id"], pending["approval_id"], "deny")
    api.wait_type(s["id"], "turn.end", after=pending["seq"])
    # Issue 21: an abbreviation of an option that runs a program is read as that option.
    for attack, said in (("sort --comp=sh notes.txt", "--compress-program"), ("git show --ext", "--ext-diff")):
        pending = one_command(api, s["id"], attack)
        assert pending["judge"]["kind"] == "rules" and said in pending["judge"]["reason"], pending["judge"]
        answer(api, s["id"], pending["approval_id"], "deny")
        api.wait_type(s["id"], "turn.end", after=pending["seq"])
    assert canned.count() == before

    respawn(stack, ["guard", "judge"], {"COX_JUDGE__KIND": "none"})
    pending = one_command(api, s["id"], "ls")
    assert pending["judge"] is None and pending["reason"] == "no judge is configured"
    answer(api, s["id"], pending["approval_id"], "allow")
    api.wait_type(s["id"], "turn.end", after=pending["seq"])
    evs = api.all_events(s["id"])
    assert final_decision(evs, call_ids(evs, "run_command")[-1])["actor"] == "person"
    respawn(stack, ["guard", "judge"], {"COX_JUDGE__KIND": "model"})
