"""The session state machine, transition by transition, through HTTP on a two-runner stack.

Each test drives one session and judges it by its event log (``logcheck.replay``): the table of
docs/design.md "The session state machine" for send / queue / steer / Stop / turn end, idle and busy, and
that a stopped or steered turn leaves no tool call without its result, whatever it was doing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from tests.support.logcheck import check_accepted, log_of, replay
from tests.support.stack import Api, Stack, script, stack_fixture

# A second model whose server never answers in time: a turn on it runs until it is stopped.
CONFIG = """
[[model.providers]]
name = "elsewhere"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "nothing"
"""

LONG = 60_000


stack = stack_fixture("sm", runners=2, config=CONFIG)


def long_turn(label: str = "hold") -> str:
    """A turn that runs (streaming its answer) until it is stopped or steered."""
    return script({"text": f"{label} " * 20, "delay_ms": LONG}, text=label)


def ok(r: Any, status: int = 202) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return dict(r.json())


def started(api: Api, sid: str, text: str, after: int = 0) -> dict[str, Any]:
    """Send ``text`` to an idle session; return the reply once its turn.start is in the log."""
    rep = ok(api.send(sid, text))
    assert rep["disposition"] == "started"
    api.wait_type(sid, "turn.start", message_id=rep["message_id"], after=after)
    return {**rep, "mode": None}


def test_send_while_busy_is_refused_and_queued_messages_run_in_order(api: Api) -> None:
    sid = api.create("sm-order")["id"]
    first = started(api, sid, long_turn())
    busy = api.send(sid, "plain send")
    assert busy.status_code == 409 and busy.json()["error"] == "busy", busy.text
    replies = [first]
    for i in range(3):
        rep = ok(api.send(sid, f"queued {i}", mode="queue"))
        assert rep["disposition"] == "queued" and rep["position"] == i + 1
        replies.append({**rep, "mode": "queue"})
    view = api.session(sid)
    assert view["busy"] and [q["message_id"] for q in view["queue"]] == [x["message_id"] for x in replies[1:]]
    steer = ok(api.send(sid, "steered", mode="steer"))
    assert steer["disposition"] == "steered" and steer["position"] == 1
    replies.append({**steer, "mode": "steer"})
    last = replies[3]["message_id"]
    api.wait_type(sid, "turn.start", message_id=last, timeout=30)
    api.wait_idle(sid, timeout=30)
    r = replay(log_of(api, sid))
    # steered runs right after the turn it stopped, ahead of the queue; the queue is kept
    assert r.starts == [first["message_id"], steer["message_id"], *(x["message_id"] for x in replies[1:4])]
    assert r.outcome_of(first["message_id"]) == "stopped"
    assert all(r.outcome_of(x["message_id"]) == "completed" for x in replies[1:])
    check_accepted(r, replies)


def test_queue_or_steer_on_an_idle_session_starts_a_turn(api: Api) -> None:
    sid = api.create("sm-idle")["id"]
    for mode in ("queue", "steer"):
        rep = ok(api.send(sid, f"idle {mode}", mode=mode))
        assert rep["disposition"] == "started" and rep.get("position") is None
        api.wait_type(sid, "turn.start", message_id=rep["message_id"])
        api.wait_idle(sid)
    evs = log_of(api, sid)
    assert [e["via"] for e in evs if e["type"] == "user.msg"] == ["queue", "steer"]
    replay(evs)


def test_stop_discards_the_queue_records_it_and_starts_nothing(api: Api) -> None:
    sid = api.create("sm-stop")["id"]
    idle = ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
    assert idle == {"turn_id": None, "discarded": [], "unapplied_leads": []}
    first = started(api, sid, long_turn())
    q = [ok(api.send(sid, f"waiting {i}", mode="queue"))["message_id"] for i in range(3)]
    res = ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
    assert res["discarded"] == q
    view = api.session(sid)
    assert view["busy"] is False and view["queue"] == [], "Stop answers once the turn has ended"
    evs = log_of(api, sid)
    r = replay(evs)
    assert r.starts == [first["message_id"]]
    assert res["turn_id"] == r.turn_of[first["message_id"]]
    assert r.discarded == [q]
    assert r.outcome_of(first["message_id"]) == "stopped"
    # nothing is deleted from the log: the discarded messages' queue.added are still there
    assert [m for m, _mode, _pos in r.queued] == q


PHASES = {
    # The model is streaming its answer: no call is open yet.
    "model": lambda: script({"text": "thinking " * 30, "delay_ms": LONG,
                             "tools": [{"name": "run_command", "args": {"command": "echo never"}}]}),
    # A command runs; a second call of the same response has not started.
    "command": lambda: script({"text": "Running.", "tools": [
        {"name": "run_command", "args": {"command": "sleep 60"}},
        {"name": "write_file", "args": {"path": "after.txt", "content": "x"}}]}),
    # A write waits for the person (a protected path); a second call has not started.
    "approval": lambda: script({"tools": [
        {"name": "write_file", "args": {"path": "Makefile", "content": "all:\n"}},
        {"name": "run_command", "args": {"command": "echo later"}}]}),
    # Between calls: two calls done, the next ones not started, a long third in between.
    "between": lambda: script({"tools": [
        {"name": "run_command", "args": {"command": "echo one"}},
        {"name": "plan_write", "args": {"steps": ["a", "b"]}},
        {"name": "run_command", "args": {"command": "sleep 60"}},
        {"name": "write_file", "args": {"path": "late.txt", "content": "x"}},
        {"name": "run_command", "args": {"command": "echo four"}}]}),
}
READY: dict[str, tuple[str, dict[str, Any]]] = {"model": ("assistant.delta", {}), "command": ("policy.decision", {"actor": "judge"}),
         "approval": ("approval.pending", {}), "between": ("tool.call", {"name": "run_command"})}


@pytest.mark.parametrize("how", ["steer", "stop"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_stopped_or_steered_turn_closes_every_call_it_opened(api: Api, stack: Stack, phase: str, how: str) -> None:
    sid = api.create(f"sm-{phase}-{how}")["id"]
    first = started(api, sid, PHASES[phase]())
    kind, match = READY[phase]
    if phase == "between":
        api.wait_for(sid, lambda e: e["type"] == "tool.call" and e.get("args", {}).get("command") == "sleep 60",
                     timeout=30)
    else:
        api.wait_type(sid, kind, timeout=30, **match)
    queued = ok(api.send(sid, "queued after", mode="queue"))
    if how == "steer":
        nxt = ok(api.send(sid, "steered in", mode="steer"))
        api.wait_type(sid, "turn.start", message_id=queued["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
    else:
        res = ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
        assert res["discarded"] == [queued["message_id"]]
    evs = log_of(api, sid)
    r = replay(evs)
    assert r.outcome_of(first["message_id"]) == "stopped"
    tid = r.turn_of[first["message_id"]]
    mine = [e for e in evs if e.get("turn_id") == tid]
    opened = [c["call_id"] for e in mine if e["type"] == "assistant.msg" for c in e.get("tool_calls") or []]
    closed = {e["call_id"]: e for e in mine if e["type"] in ("tool.result", "tool.skipped")}
    assert set(opened) == set(closed), f"open calls left: {set(opened) - set(closed)}"
    if phase == "model":
        assert opened == []
    else:
        reason = "steer" if how == "steer" else "stop"
        skipped = [c for c in closed.values() if c["type"] == "tool.skipped"]
        assert skipped and all(s["reason"] == reason for s in skipped), skipped
        cut = [c for c in closed.values() if c["type"] == "tool.result" and c["output"].startswith("Cancelled")]
        assert len(cut) == 1, closed
        assert ("steered" if how == "steer" else "stopped") in cut[0]["output"]
    if phase == "approval":
        res_ev = [e for e in mine if e["type"] == "approval.resolved"]
        assert res_ev and res_ev[0]["decision"] == "deny"
        assert api.session(sid)["approvals"] == []
    if phase == "between":
        import pathlib

        assert not (pathlib.Path(api.session(sid)["workspace"]) / "late.txt").exists()
    if how == "steer":
        assert r.starts == [first["message_id"], nxt["message_id"], queued["message_id"]]
        # the next model request saw a closed transcript: the steered turn ran to completion
        assert r.outcome_of(nxt["message_id"]) == "completed"
    else:
        assert r.starts == [first["message_id"]]


@pytest.mark.parametrize("how", ["steer", "stop"])
def test_a_steered_or_stopped_turn_keeps_its_plan_for_the_next_message(api: Api, how: str) -> None:
    sid = api.create(f"sm-plan-{how}")["id"]
    first = started(api, sid, script({"tools": [{"name": "plan_write", "args": {"steps": ["read", "fix", "test"]}}]},
                                     {"tools": [{"name": "plan_step", "args": {"step": 1}}]},
                                     {"text": "working", "delay_ms": LONG}))
    api.wait_type(sid, "plan.step", timeout=30)
    if how == "steer":
        nxt = ok(api.send(sid, "correction", mode="steer"))
    else:
        ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
        nxt = ok(api.send(sid, "correction"))
    st = api.wait_type(sid, "turn.start", message_id=nxt["message_id"], timeout=30)
    carried = api.wait_type(sid, "plan.carried", turn_id=st["turn_id"], timeout=30)
    assert carried["steps"] == ["read", "fix", "test"] and carried["marks"] == [1]
    api.wait_idle(sid, timeout=30)
    r = replay(log_of(api, sid))
    assert r.outcome_of(first["message_id"]) == "stopped"


def test_a_model_chosen_while_a_turn_runs_applies_before_the_next_queued_message(api: Api) -> None:
    sid = api.create("sm-model")["id"]
    first = started(api, sid, long_turn())
    patched = api.http.patch(f"/v1/sessions/{sid}", json={"model": "elsewhere"})
    assert patched.status_code == 200, patched.text
    assert patched.json()["model"] == "script" and patched.json()["next_model"] == "elsewhere"
    q = ok(api.send(sid, "on the new model", mode="queue"))
    ok(api.send(sid, "steer to it", mode="steer"))
    nxt = api.wait_for(sid, lambda e: e["type"] == "turn.start" and e["message_id"] != first["message_id"],
                       timeout=30)
    assert nxt["model"] == "elsewhere"
    assert api.session(sid)["model"] == "elsewhere"
    res = ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
    assert res["discarded"] == [q["message_id"]]
    back = api.http.patch(f"/v1/sessions/{sid}", json={"model": "script"})
    assert back.status_code == 200 and back.json()["model"] == "script"
    # chosen while busy with nothing queued: applied when the session goes idle
    started(api, sid, long_turn())
    assert api.http.patch(f"/v1/sessions/{sid}", json={"model": "elsewhere"}).json()["next_model"] == "elsewhere"
    ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
    view = api.session(sid)
    assert view["busy"] is False and view["model"] == "elsewhere" and view["next_model"] is None
    replay(log_of(api, sid))


def test_client_id_makes_a_send_idempotent(api: Api) -> None:
    sid = api.create("sm-cid")["id"]
    a = ok(api.send(sid, long_turn(), client_id="c-1"))
    again = ok(api.send(sid, long_turn(), client_id="c-1"))
    assert again == a
    q1 = ok(api.send(sid, "once", mode="queue", client_id="c-2"))
    q2 = ok(api.send(sid, "once", mode="queue", client_id="c-2"))
    assert q1 == q2 and q1["disposition"] == "queued"
    assert len(api.session(sid)["queue"]) == 1
    api.http.post(f"/v1/sessions/{sid}/stop")
    r = replay(log_of(api, sid))
    assert r.starts == [a["message_id"]] and r.discarded == [[q1["message_id"]]]


# ---------------------------------------------------------------- property test

KINDS_LONG = ("long-model", "long-command", "long-approval")
KINDS_SHORT = ("short-text", "short-tools")
OPS = {"count": 0, "examples": 0}


def message_text(kind: str, label: str) -> str:
    if kind == "long-model":
        return script({"text": f"{label} " * 10, "delay_ms": LONG}, text=label)
    if kind == "long-command":
        return script({"tools": [{"name": "run_command", "args": {"command": "sleep 60"}},
                                 {"name": "run_command", "args": {"command": "echo never"}}]}, text=label)
    if kind == "long-approval":
        return script({"tools": [{"name": "write_file", "args": {"path": "Makefile", "content": "x:\n"}}]}, text=label)
    if kind == "short-tools":
        return script({"tools": [{"name": "run_command", "args": {"command": f"echo {label}"}}]},
                      {"text": f"{label} done"}, text=label)
    return f"{label}: hello"


@dataclass
class Msg:
    message_id: str
    kind: str

    @property
    def long(self) -> bool:
        return self.kind.startswith("long")


def test_the_http_api_follows_a_reference_model_of_the_table(stack: Stack) -> None:
    """Random send / queue / steer / Stop / client_id retries against one session per example,
    compared after every step with a small model of the table, and at the end with the log.

    Long turns run until stopped (model streaming, a command, an approval wait); short ones
    complete. After each step the test waits until the session has settled where the model says
    (short turns done, the next long one running), so every answer the model predicts is exact.
    """
    api = stack.client(timeout=60)

    class Table(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            OPS["examples"] += 1
            self.sid = api.create("prop")["id"]
            self.running: Msg | None = None
            self.running_turn: str | None = None
            self.waiting: list[Msg] = []
            self.expected_starts: list[str] = []
            self.outcomes: dict[str, str] = {}
            self.replies: list[dict[str, Any]] = []
            self.by_cid: dict[str, dict[str, Any]] = {}
            self.seen = 0
            self.n = 0

        # -- the model
        def _start(self, m: Msg) -> None:
            self.running = m
            self.expected_starts.append(m.message_id)

        def _settle_model(self) -> None:
            while self.running is not None and not self.running.long:
                self.outcomes[self.running.message_id] = "completed"
                self.running = None
                if self.waiting:
                    self._start(self.waiting.pop(0))

        # -- the system, waited on until it matches the model
        def _settle(self) -> None:
            self._settle_model()
            if self.running is None:
                view = api.wait_idle(self.sid, timeout=30)
                self.running_turn = None
            else:
                st = api.wait_type(self.sid, "turn.start", message_id=self.running.message_id, timeout=30)
                self.running_turn = st["turn_id"]
                view = api.session(self.sid)
                assert view["busy"] and view["turn_id"] == self.running_turn
            assert [q["message_id"] for q in view["queue"]] == [m.message_id for m in self.waiting]

        def _send(self, kind: str, mode: str | None, cid: bool) -> None:
            OPS["count"] += 1
            self.n += 1
            client_id = f"c{self.n}" if cid else None
            r = api.send(self.sid, message_text(kind, f"m{self.n}"), mode=mode,
                         **({"client_id": client_id} if client_id else {}))
            if self.running is None:
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "started" and rep.get("position") is None
                self._start(Msg(rep["message_id"], kind))
            elif mode is None:
                assert r.status_code == 409 and r.json()["error"] == "busy", r.text
                return
            elif mode == "queue":
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "queued" and rep["position"] == len(self.waiting) + 1, rep
                self.waiting.append(Msg(rep["message_id"], kind))
            else:
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "steered" and rep["position"] == 1, rep
                self.outcomes[self.running.message_id] = "stopped"
                self.running = None
                self._start(Msg(rep["message_id"], kind))
            self.replies.append({**rep, "mode": mode})
            if client_id:
                self.by_cid[client_id] = {"reply": rep, "kind": kind, "mode": mode}
            self._settle()

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        def send(self, kind: str, cid: bool) -> None:
            self._send(kind, None, cid)

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        def queue(self, kind: str, cid: bool) -> None:
            self._send(kind, "queue", cid)

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        def steer(self, kind: str, cid: bool) -> None:
            self._send(kind, "steer", cid)

        @rule()
        def stop(self) -> None:
            OPS["count"] += 1
            r = api.http.post(f"/v1/sessions/{self.sid}/stop")
            assert r.status_code == 200, r.text
            res = r.json()
            if self.running is None:
                assert res == {"turn_id": None, "discarded": [], "unapplied_leads": []}
            else:
                assert res["turn_id"] == self.running_turn
                assert res["discarded"] == [m.message_id for m in self.waiting]
                self.outcomes[self.running.message_id] = "stopped"
                self.running = None
                self.waiting = []
            self._settle()

        @precondition(lambda self: bool(self.by_cid))
        @rule(data=st.data())
        def retry_with_the_same_client_id(self, data: st.DataObject) -> None:
            OPS["count"] += 1
            cid = data.draw(st.sampled_from(sorted(self.by_cid)))
            first = self.by_cid[cid]
            r = api.send(self.sid, message_text(first["kind"], "retry"), mode=first["mode"], client_id=cid)
            assert r.status_code == 202, r.text
            assert r.json() == first["reply"], "a retry answers what the first send was answered"
            self._settle()

        def teardown(self) -> None:
            try:
                self._settle()
                evs = log_of(api, self.sid)
                r = replay(evs, settled=self.running is None)
                assert r.starts == self.expected_starts
                for mid, outcome in self.outcomes.items():
                    assert r.outcome_of(mid) == outcome, (mid, outcome, r.outcome_of(mid))
                check_accepted(r, self.replies)
            finally:
                api.http.post(f"/v1/sessions/{self.sid}/stop")

    try:
        run_state_machine_as_test(Table, settings=settings(
            max_examples=int(os.environ.get("COX_PROPERTY_EXAMPLES", "40")), stateful_step_count=15,
            deadline=None, suppress_health_check=list(HealthCheck), database=None,
        ))
    finally:
        api.close()
        print(f"property test: {OPS['count']} random operations in {OPS['examples']} examples")
