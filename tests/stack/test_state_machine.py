"""The session state machine, transition by transition, through HTTP on a two-runner stack.

Each test drives one session and judges it by its event log (``logcheck.replay``): the table of
docs/design.md "The session state machine" for send / queue / steer / Stop / turn end, idle and busy, and
that a stopped or steered turn leaves no tool call without its result, whatever it was doing.
The property test at the end runs random sequences of every person's action (send, queue,
steer, Stop, Lead, queue removal and reorder, approval answers, fork, rewind) against a model of
the table (``COX_PROPERTY_RANDOM=1`` explores new sequences; ``COX_PROPERTY_TRACE=1`` prints each
step).
"""

from __future__ import annotations

import json
import os
import pathlib
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

KINDS_LONG = ("long-model", "long-command", "long-approval", "long-ticks")
KINDS_SHORT = ("short-text", "short-tools", "short-history")
TICKS = 150
"""Rounds of a ``long-ticks`` turn: a safe boundary every ~0.4 s for a minute (a Lead applies)."""
MAX_PENDING = 8
STATS: dict[str, int] = {"examples": 0, "steps": 0}


def message_text(kind: str, label: str) -> str:
    """A message whose first line is ``label`` (what the script model's ``history`` lists)."""
    if kind == "long-model":
        return script({"text": f"{label} " * 300, "delay_ms": LONG}, text=label)
    if kind == "long-command":
        return script({"tools": [{"name": "run_command", "args": {"command": "sleep 60"}},
                                 {"name": "run_command", "args": {"command": "echo never"}}]}, text=label)
    if kind == "long-approval":
        return script({"tools": [{"name": "write_file", "args": {"path": "Makefile", "content": "x:\n"}}]}, text=label)
    if kind == "long-ticks":
        return script(*({"tools": [{"name": "respond", "args": {"text": f"{label} tick {i}"}}], "delay_ms": 400}
                        for i in range(TICKS)), text=label)
    if kind == "short-tools":
        return script({"tools": [{"name": "run_command", "args": {"command": f"echo {label}"}}]},
                      {"text": f"{label} done"}, text=label)
    if kind == "short-history":
        return script({"history": True}, text=label)
    return f"{label}\nhello"


def lead_text(long: bool, label: str) -> str:
    """A Lead: ``long`` holds a script that replaces the turn's remaining steps with a minute of
    streaming; otherwise plain text (the running script goes on)."""
    return script({"text": f"{label} " * 300, "delay_ms": LONG}, text=label) if long else f"{label}: plain"


@dataclass
class Msg:
    message_id: str
    kind: str
    label: str
    ready_after: int | None = 0
    """``None`` once the turn is in its long phase (a Lead saved now waits for a boundary that
    only Stop or steer brings); else the seq after which to look for the sign of that phase."""

    @property
    def long(self) -> bool:
        return self.kind.startswith("long")


def tally(name: str) -> None:
    STATS[name] = STATS.get(name, 0) + 1


def counted(fn: Any) -> Any:
    """A rule that counts its runs in :data:`STATS` (by name)."""
    import functools

    @functools.wraps(fn)
    def run(*a: Any, **kw: Any) -> Any:
        STATS["steps"] += 1
        STATS[fn.__name__] = STATS.get(fn.__name__, 0) + 1
        if os.environ.get("COX_PROPERTY_TRACE"):
            print(f"  {fn.__name__} {kw}", flush=True)
        return fn(*a, **kw)

    return run


def test_the_http_api_follows_a_reference_model_of_the_table(stack: Stack) -> None:
    """Random send / queue / steer / Stop / client_id retries / Lead / queue removal and reorder /
    approval answers / fork / rewind against one session per example, compared after every step
    with a small model of docs/design.md's table, and at the end with the log.

    Long turns run until stopped (model streaming, a command, an approval wait, or a minute of
    ``respond`` rounds, each a safe boundary); short ones complete. After each step the test waits
    until the session has settled where the model says (short turns done, the next long one
    running, a Lead on a turn with boundaries applied, an approval pending), so every answer the
    model predicts is exact: status, error code, reply fields, the session object's queue, leads
    and approvals, and at the end the log (turn order, outcomes, every accepted message once, in
    order) and what the model was sent (``history`` turns, forks and rewinds included).

    Bounded by ``COX_PROPERTY_EXAMPLES`` (default 50) x ``COX_PROPERTY_STEPS`` (default 15);
    derandomized (the same examples every run, for CI) unless ``COX_PROPERTY_RANDOM=1``.
    """
    api = stack.client(timeout=60)

    class Table(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            STATS["examples"] += 1
            self.ws = f"prop-{STATS['examples']}"
            self.sid = api.create(self.ws)["id"]
            if os.environ.get("COX_PROPERTY_TRACE"):
                print(f"example {STATS['examples']}: {self.sid}", flush=True)
            self.running: Msg | None = None
            self.running_turn: str | None = None
            self.waiting: list[Msg] = []
            self.expected_starts: list[str] = []
            self.turn_ids: list[str] = []
            self.outcomes: dict[str, str] = {}
            self.replies: list[dict[str, Any]] = []
            self.by_cid: dict[str, dict[str, Any]] = {}
            self.gone: list[str] = []
            """message ids that will never start again (ran, discarded, removed)"""
            self.n = 0
            # what the model is sent: the first line of each turn's message in its transcript
            self.transcript: list[str] = []
            self.transcript_at_end: dict[int, list[str]] = {}
            self.history_of: dict[str, list[str]] = {}
            # the one file any turn writes (an allowed approval), and whether it existed per turn end
            self.makefile = False
            self.makefile_at_end: dict[int, bool] = {}
            self.leads: dict[str, str] = {}
            self.pending: list[str] = []
            self.pending_long = False
            self.approval: str | None = None
            self.old_approvals: list[str] = []

        # -- the model
        def _label(self) -> str:
            self.n += 1
            return f"m{self.n}"

        def _start(self, m: Msg) -> None:
            self.running = m
            self.expected_starts.append(m.message_id)
            self.transcript.append(m.label)
            if m.kind == "short-history":
                self.history_of[m.message_id] = list(self.transcript)

        def _end(self, outcome: str) -> None:
            assert self.running is not None
            self.outcomes[self.running.message_id] = outcome
            self.gone.append(self.running.message_id)
            number = len(self.expected_starts)
            self.transcript_at_end[number] = list(self.transcript)
            self.makefile_at_end[number] = self.makefile
            for lid in self.pending:
                self.leads[lid] = "unapplied"
            self.pending = []
            self.pending_long = False
            if self.approval:
                self.old_approvals.append(self.approval)
                self.approval = None
            self.running = None

        def _settle_model(self) -> None:
            while self.running is not None and not self.running.long:
                self._end("completed")
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
                if self.running_turn != st["turn_id"]:
                    self.running_turn = st["turn_id"]
                    self.turn_ids.append(st["turn_id"])
                self._await_long_phase()
                if self.running.kind == "long-ticks" and self.pending:
                    self._await_applied()
                view = api.session(self.sid)
                assert view["busy"] and view["turn_id"] == self.running_turn
            assert [q["message_id"] for q in view["queue"]] == [m.message_id for m in self.waiting]
            assert {x["lead_id"]: x["state"] for x in view["leads"]} == self.leads
            assert [a["approval_id"] for a in view["approvals"]] == ([self.approval] if self.approval else [])

        def _await_long_phase(self) -> None:
            """A Lead saved before the first response has ended joins at the boundary after it: wait
            until the turn is where it stays (streaming, its command running, the approval asked)."""
            m = self.running
            assert m is not None
            if m.ready_after is None:
                return
            tid, after = self.running_turn, m.ready_after
            if m.kind == "long-model":
                api.wait_type(self.sid, "assistant.delta", turn_id=tid, after=after, timeout=30)
            elif m.kind == "long-command":
                api.wait_for(self.sid, lambda e: e["type"] == "tool.call" and e["turn_id"] == tid
                             and e["args"].get("command") == "sleep 60", after=after, timeout=30)
            elif m.kind == "long-approval":
                ev = api.wait_type(self.sid, "approval.pending", turn_id=tid, after=after, timeout=30)
                self.approval = ev["approval_id"]
            m.ready_after = None

        def _await_applied(self) -> None:
            """Every pending Lead applies at the next boundary: wait for its ``lead.applied``."""
            want, seen = set(self.pending), 0
            while want:
                def applied(e: dict[str, Any], w: frozenset[str] = frozenset(want)) -> bool:
                    return e["type"] == "lead.applied" and bool(w & set(e["lead_ids"]))

                ev = api.wait_for(self.sid, applied, timeout=30, after=seen)
                seen = ev["seq"]
                want -= set(ev["lead_ids"])
            for lid in self.pending:
                self.leads[lid] = "applied"
            self.pending = []
            if self.pending_long:
                assert self.running is not None
                self.running.kind = "long-model"  # the Lead's script replaced the remaining steps
                self.running.ready_after = seen
            self.pending_long = False

        def _send(self, kind: str, mode: str | None, cid: bool) -> None:
            label = self._label()
            client_id = f"c{self.n}" if cid else None
            r = api.send(self.sid, message_text(kind, label), mode=mode,
                         **({"client_id": client_id} if client_id else {}))
            if self.running is None:
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "started" and rep.get("position") is None
                self._start(Msg(rep["message_id"], kind, label))
            elif mode is None:
                assert r.status_code == 409 and r.json()["error"] == "busy", r.text
                return
            elif mode == "queue":
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "queued" and rep["position"] == len(self.waiting) + 1, rep
                self.waiting.append(Msg(rep["message_id"], kind, label))
            else:
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["disposition"] == "steered" and rep["position"] == 1, rep
                self._end("stopped")
                self._start(Msg(rep["message_id"], kind, label))
            self.replies.append({**rep, "mode": mode})
            if client_id:
                self.by_cid[client_id] = {"reply": rep, "kind": kind, "mode": mode}
            self._settle()

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        @counted
        def send(self, kind: str, cid: bool) -> None:
            self._send(kind, None, cid)

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        @counted
        def queue(self, kind: str, cid: bool) -> None:
            self._send(kind, "queue", cid)

        @rule(kind=st.sampled_from(KINDS_LONG + KINDS_SHORT), cid=st.booleans())
        @counted
        def steer(self, kind: str, cid: bool) -> None:
            self._send(kind, "steer", cid)

        @rule(mode=st.sampled_from([None, "queue", "steer"]), leads=st.integers(0, 2), long_lead=st.booleans(),
              then=st.sampled_from([None, "allow", "deny"]), message=st.booleans())
        @counted
        def ask(self, mode: str | None, leads: int, long_lead: bool, then: str | None, message: bool) -> None:
            """A turn that asks the person (more often than a send of a random kind would), then
            maybe Leads saved while it waits and an answer: the combinations a rule at a time
            would rarely reach."""
            self._send("long-approval", mode, False)
            if self.approval is None:
                return
            for i in range(leads):
                self._lead(long_lead and i == leads - 1, "running")
            if then:
                self._answer(then == "allow", message)

        @rule()
        @counted
        def stop(self) -> None:
            r = api.http.post(f"/v1/sessions/{self.sid}/stop")
            assert r.status_code == 200, r.text
            res = r.json()
            if self.running is None:
                assert res == {"turn_id": None, "discarded": [], "unapplied_leads": []}
            else:
                assert res["turn_id"] == self.running_turn
                assert res["discarded"] == [m.message_id for m in self.waiting]
                assert res["unapplied_leads"] == self.pending
                self.gone.extend(m.message_id for m in self.waiting)
                self._end("stopped")
                self.waiting = []
            self._settle()

        @precondition(lambda self: bool(self.by_cid))
        @rule(data=st.data())
        @counted
        def retry_with_the_same_client_id(self, data: st.DataObject) -> None:
            cid = data.draw(st.sampled_from(sorted(self.by_cid)))
            first = self.by_cid[cid]
            r = api.send(self.sid, message_text(first["kind"], "retry"), mode=first["mode"], client_id=cid)
            assert r.status_code == 202, r.text
            assert r.json() == first["reply"], "a retry answers what the first send was answered"
            self._settle()

        @rule(long=st.booleans(), name_turn=st.sampled_from(["none", "running", "stale"]))
        @counted
        def lead(self, long: bool, name_turn: str) -> None:
            self._lead(long, name_turn)

        def _lead(self, long: bool, name_turn: str) -> None:
            label = self._label()
            body: dict[str, Any] = {"text": lead_text(long, label)}
            if name_turn == "running" and self.running_turn:
                body["turn_id"] = self.running_turn
            stale = name_turn == "stale" and len(self.turn_ids) > (1 if self.running else 0)
            if stale:
                body["turn_id"] = self.turn_ids[-2] if self.running else self.turn_ids[-1]
            r = api.http.post(f"/v1/sessions/{self.sid}/lead", json=body)
            tally(f"lead {r.status_code}")
            if self.running is None or stale:
                assert r.status_code == 409 and r.json()["error"] == "no_turn", r.text
            elif len(self.pending) >= MAX_PENDING:
                assert r.status_code == 429 and r.json()["error"] == "too_many_pending", r.text
            else:
                assert r.status_code == 202, r.text
                rep = r.json()
                assert rep["pending"] == len(self.pending) + 1 and rep["turn_id"] == self.running_turn, rep
                self.pending.append(rep["lead_id"])
                self.leads[rep["lead_id"]] = "pending"
                self.pending_long = self.pending_long or long
            self._settle()

        @precondition(lambda self: self.approval is not None)
        @rule(allow=st.booleans(), message=st.booleans())
        @counted
        def answer(self, allow: bool, message: bool) -> None:
            self._answer(allow, message)

        def _answer(self, allow: bool, message: bool) -> None:
            assert self.running is not None and self.approval is not None
            aid = self.approval
            body: dict[str, Any] = {"decision": "allow" if allow else "deny"}
            if message:
                body["message"] = f"{self._label()}: about that"
            r = api.http.post(f"/v1/sessions/{self.sid}/approvals/{aid}", json=body)
            assert r.status_code == 200, r.text
            assert r.json() == {"ok": True, "approval_id": aid, "decision": body["decision"]}, r.text
            tally(f"answered {body['decision']}" + (" with leads" if self.pending else ""))
            self.old_approvals.append(aid)
            self.approval = None
            if allow:
                self.makefile = True
            # the call runs (or is denied), then the Leads that waited apply
            if self.pending:
                self._await_applied()
            if self.running.kind == "long-approval":
                self.running.kind = "short-answered"  # past its last step: the script is done
            self._settle()

        @precondition(lambda self: bool(self.old_approvals))
        @rule(data=st.data())
        @counted
        def answer_again(self, data: st.DataObject) -> None:
            aid = data.draw(st.sampled_from(self.old_approvals))
            r = api.http.post(f"/v1/sessions/{self.sid}/approvals/{aid}", json={"decision": "allow"})
            assert r.status_code == 409 and r.json()["error"] == "resolved", r.text
            self._settle()

        @rule(data=st.data())
        @counted
        def remove_queued(self, data: st.DataObject) -> None:
            choices = [m.message_id for m in self.waiting] + self.gone
            if not choices:
                return
            mid = data.draw(st.sampled_from(choices))
            r = api.http.delete(f"/v1/sessions/{self.sid}/queue/{mid}")
            if mid in self.gone:
                assert r.status_code == 409 and r.json()["error"] == "not_queued", r.text
            else:
                assert r.status_code == 200, r.text
                self.waiting = [m for m in self.waiting if m.message_id != mid]
                self.gone.append(mid)
                assert r.json() == {"queue": [m.message_id for m in self.waiting], "removed": mid,
                                    "changed": True}, r.text
            self._settle()

        @precondition(lambda self: bool(self.waiting))
        @rule(data=st.data(), stale=st.booleans())
        @counted
        def reorder(self, data: st.DataObject, stale: bool) -> None:
            ids = [m.message_id for m in self.waiting]
            order = data.draw(st.permutations(ids))
            if stale:
                order = order[1:] + (self.gone[-1:] if self.gone else [])
            r = api.http.put(f"/v1/sessions/{self.sid}/queue/order", json={"message_ids": order})
            if stale:
                assert r.status_code == 409 and r.json()["error"] == "not_queued", r.text
            else:
                assert r.status_code == 200, r.text
                assert r.json() == {"queue": order, "removed": None, "changed": order != ids}, r.text
                by_id = {m.message_id: m for m in self.waiting}
                self.waiting = [by_id[x] for x in order]
            self._settle()

        def _turn_choice(self, data: st.DataObject) -> int:
            return data.draw(st.integers(min_value=1, max_value=len(self.expected_starts) + 1))

        @precondition(lambda self: bool(self.expected_starts))
        @rule(data=st.data())
        @counted
        def fork(self, data: st.DataObject) -> None:
            at = self._turn_choice(data)
            r = api.http.post(f"/v1/sessions/{self.sid}/fork", json={"at_turn": at})
            if at > len(self.expected_starts):
                assert r.status_code == 422 and r.json()["error"] == "invalid", r.text
            elif self.running is not None and at == len(self.expected_starts):
                assert r.status_code == 409 and r.json()["error"] == "busy", r.text
            else:
                assert r.status_code == 201, r.text
                fork = r.json()
                assert fork["busy"] is False and fork["queue"] == [] and fork["leads"] == []
                evs = log_of(api, fork["id"])
                forked = [e for e in evs if e["type"] == "session.forked"]
                assert len(forked) == 1 and forked[0]["from_sid"] == self.sid and forked[0]["at_turn"] == at
                rf = replay(evs)
                assert len(rf.starts) == len(self.transcript_at_end[at])
                assert (pathlib.Path(fork["workspace"]) / "Makefile").exists() == self.makefile_at_end[at]
                # what the fork's model is sent: the transcript of that turn's end, then the new turn
                sent = ok(api.send(fork["id"], message_text("short-history", "fork-check")))
                api.wait_type(fork["id"], "turn.start", message_id=sent["message_id"], timeout=30)
                api.wait_idle(fork["id"], timeout=30)
                assert history_sent(api, fork["id"], sent["message_id"]) == [*self.transcript_at_end[at], "fork-check"]
            self._settle()

        @precondition(lambda self: bool(self.expected_starts))
        @rule(data=st.data(), scope=st.sampled_from(["conversation", "files", "both"]))
        @counted
        def rewind(self, data: st.DataObject, scope: str) -> None:
            to = self._turn_choice(data)
            r = api.http.post(f"/v1/sessions/{self.sid}/rewind", json={"to_turn": to, "scope": scope})
            if self.running is not None:
                assert r.status_code == 409 and r.json()["error"] == "busy", r.text
            elif to > len(self.expected_starts):
                assert r.status_code == 422 and r.json()["error"] == "invalid", r.text
            else:
                assert r.status_code == 200, r.text
                res = r.json()
                assert res["to_turn"] == to and res["scope"] == scope
                want_files: list[str] = []
                if scope != "conversation":
                    if self.makefile != self.makefile_at_end[to]:
                        want_files = ["Makefile"]
                    self.makefile = self.makefile_at_end[to]
                assert res["restored_files"] == want_files, res
                if scope != "files":
                    self.transcript = list(self.transcript_at_end[to])
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
                for mid, want in self.history_of.items():
                    assert history_sent(api, self.sid, mid, evs) == want, mid
                ws = pathlib.Path(api.session(self.sid)["workspace"])
                assert (ws / "Makefile").exists() == self.makefile
            finally:
                api.http.post(f"/v1/sessions/{self.sid}/stop")

    try:
        run_state_machine_as_test(Table, settings=settings(
            max_examples=int(os.environ.get("COX_PROPERTY_EXAMPLES", "50")),
            stateful_step_count=int(os.environ.get("COX_PROPERTY_STEPS", "15")),
            derandomize=os.environ.get("COX_PROPERTY_RANDOM") != "1",
            deadline=None, suppress_health_check=list(HealthCheck), database=None,
        ))
    finally:
        api.close()
        rules = ", ".join(f"{k} {v}" for k, v in sorted(STATS.items()) if k not in ("examples", "steps"))
        print(f"property test: {STATS['steps']} steps in {STATS['examples']} examples ({rules})")


def history_sent(api: Api, sid: str, message_id: str, evs: list[dict[str, Any]] | None = None) -> list[str]:
    """What the model was sent in the turn of ``message_id`` (a ``short-history`` message): the
    first line of every turn's message its request held, oldest first."""
    evs = evs if evs is not None else log_of(api, sid)
    tid = next(e["turn_id"] for e in evs if e["type"] == "turn.start" and e["message_id"] == message_id)
    msg = next(e for e in evs if e["type"] == "assistant.msg" and e["turn_id"] == tid)
    assert msg["text"].startswith("history: "), msg
    return list(json.loads(msg["text"].removeprefix("history: ")))
