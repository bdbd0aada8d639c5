"""A Lead applied at a safe boundary in the boundary's own record (:meth:`cox_runner.leads.Leads.boundary`),
on a real Redis with the library loaded and a real nats-server.

The unstarted calls' skips, whatever waited to be recorded before them (a response recorded with
its first read's record), the Leads' user messages and ``lead.applied`` go in one Redis call and
one publish, in that order: the Lead is in the log with the boundary, not a round trip after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from pydantic_ai.messages import ToolCallPart

from cox_runner.doorbell import Doorbell
from cox_runner.drive import take_renewal
from cox_runner.leads import Leads
from cox_runner.redis.store import Store
from cox_runner.turn import Turn
from coxswain import events as ev

from .test_outbox_publisher import busy, run
from .test_read_groups import logged, recorder


class CountedEmits:
    """The store's ``emit``, each call's events counted."""

    def __init__(self, store: Store) -> None:
        self.real = store.fns.emit
        self.calls: list[int] = []
        store.fns.emit = self  # type: ignore[method-assign]

    async def __call__(self, **kw: Any) -> Any:
        self.calls.append(len(kw["events"]))
        return await self.real(**kw)


def test_the_skips_and_the_leads_go_out_with_the_boundary_in_one_call(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_boundary"
        token = await busy(one, sid)
        for k in range(2):
            await two.fns.lead(sid=sid, principal="p", lead_id=f"l_{k}", text=f"lead {k}", client_id="",
                               max_pending=8, owner=two.owner, want_turn="")
        rec = recorder(one, r, sid, token)
        calls = [ToolCallPart(tool_name="list_dir", args={"path": f"d{k}"}, tool_call_id=f"c{k}") for k in range(2)]
        rec.defer(ev.AssistantMsg(**rec.e(), text="", finish_reason="tool_call", usage={},
                                  tool_calls=[ev.ToolCallRef(call_id=c.tool_call_id, name=c.tool_name, args={})
                                              for c in calls]),
                  ops=[("hset", ":open", c.tool_call_id, c.tool_name) for c in calls])
        rec.open = {c.tool_call_id: c for c in calls}
        rec.turn.leads_waiting = True  # the doorbell rang while the model answered
        emits = CountedEmits(one)
        called: list[str] = []
        real_call = one.call

        async def every_call(fn: str, *args: Any, **kw: Any) -> Any:
            called.append(fn)
            return await real_call(fn, *args, **kw)

        one.call = every_call  # type: ignore[method-assign]
        leads = Leads(cast(Any, SimpleNamespace(store=one, owner=one.owner, redis=r)), rec.turn, rec)
        assert await leads.boundary(calls) is True
        assert emits.calls == [3], emits.calls
        assert called == ["cox_emit"], "the Leads are taken by the boundary's record, not a call of their own"
        assert rec.pending_user == [("lead 0", "lead"), ("lead 1", "lead")]
        assert rec.open == {} and not leads.waiting()
        evs = [e for e in await logged(js, r, sid) if e["type"] != "lead.saved"][-6:]
        assert [e["type"] for e in evs] == ["assistant.msg", "tool.skipped", "tool.skipped", "user.msg", "user.msg",
                                            "lead.applied"], evs
        assert [e["call_id"] for e in evs[1:3]] == ["c0", "c1"] and all(e["reason"] == "lead" for e in evs[1:3])
        assert evs[5]["lead_ids"] == ["l_0", "l_1"]
        seqs = [e["seq"] for e in evs]
        assert seqs == list(range(seqs[0], seqs[0] + 6)), "no gap, no repeat"

    run(tmp_path, go)



async def _renewal(store: Store, r: Any, sid: str, token: str) -> dict[str, Any]:
    """A renewal's reply, as the lease keeper reads it (cox_runner.drive)."""
    async with r.pipeline(transaction=False) as pipe:
        store.fns.renew(pipe, sid=sid, token=token, lease_ms=30_000)
        res = await pipe.execute()
    head: dict[str, Any] = json.loads(res[0][0])
    return head


async def _late_bell(turn: Turn, lead_id: str) -> None:
    """The holder's doorbell for ``lead_id``, taken as :meth:`cox_runner.doorbell.Doorbell.answer` takes it."""
    drives = SimpleNamespace(get=lambda sid: SimpleNamespace(turn=turn))
    await Doorbell(cast(Any, None), "me", cast(Any, drives), None).answer(turn.sid, "lead", {"lead_id": lead_id})


def test_a_late_doorbell_or_renewal_for_a_lead_already_taken_skips_nothing(tmp_path: Path) -> None:
    """A Lead saved while a record was on its way is taken at once (that record's reply says it
    waits); its doorbell, rung by the runner that admitted it, may arrive after, and so may a
    renewal read before the take. Neither may make the next boundary skip the response's calls
    for a Lead already applied; a doorbell for a Lead not taken yet still counts."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_late_bell"
        token = await busy(one, sid)
        await two.fns.lead(sid=sid, principal="p", lead_id="l_0", text="lead 0", client_id="",
                           max_pending=8, owner=two.owner, want_turn="")
        rec = recorder(one, r, sid, token)
        t = rec.turn
        leads = Leads(cast(Any, SimpleNamespace(store=one, owner=one.owner, redis=r)), t, rec)
        stale = await _renewal(one, r, sid, token)
        assert stale["leads"] == 1 and stale["lead_last"] == "l_0"
        rec.leads_hint = 1  # the last record's reply: a Lead waits
        assert await leads.apply() is True
        rec.take_pending()
        await _late_bell(t, "l_0")  # its doorbell, late
        take_renewal(cast(Any, SimpleNamespace(turn=t)), {**stale, "turn_id": t.turn_id})  # a renewal, late
        assert not leads.waiting()
        calls = [ToolCallPart(tool_name="list_dir", args={"path": "d"}, tool_call_id="c_next")]
        rec.open = {"c_next": calls[0]}
        assert await leads.boundary(calls) is False, "no Lead waits: the next response's calls run"
        assert rec.open == {"c_next": calls[0]}
        assert not [e for e in await logged(js, r, sid) if e["type"] == "tool.skipped"]
        await two.fns.lead(sid=sid, principal="p", lead_id="l_1", text="lead 1", client_id="",
                           max_pending=8, owner=two.owner, want_turn="")
        await _late_bell(t, "l_1")
        assert leads.waiting()
        assert await leads.boundary(calls) is True
        assert rec.pending_user == [("lead 1", "lead")] and list(t.leads_taken) == ["l_0", "l_1"]
        fresh = await _renewal(one, r, sid, token)
        assert fresh["leads"] == 0 and fresh["lead_last"] == ""

    run(tmp_path, go)


def _round_last_read(rec: Any, k: int) -> ToolCallPart:
    call = ToolCallPart(tool_name="list_dir", args={"path": f"d{k}"}, tool_call_id=f"c{k}")
    rec.defer(ev.ToolCall(**rec.e(), call_id=call.tool_call_id, name="list_dir", args={"path": f"d{k}"}),
              ev.PolicyDecision(**rec.e(), call_id=call.tool_call_id, verdict="allow", actor="policy", reason="a read"))
    rec.open[call.tool_call_id] = call
    return call


def test_a_lead_saved_while_the_rounds_last_call_ran_goes_with_its_result(tmp_path: Path) -> None:
    """The boundary after a response's last call: the Leads saved while the call ran are taken by
    its result's own record (one call, one publish), when the turn goes on after that result
    (``Recorder.takes_leads`` says so, given the output); else the result is recorded alone and
    the Leads wait, as before."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_round_end"
        token = await busy(one, sid)
        rec = recorder(one, r, sid, token)
        t = rec.turn
        emits = CountedEmits(one)
        await two.fns.lead(sid=sid, principal="p", lead_id="l_0", text="lead 0", client_id="",
                           max_pending=8, owner=two.owner, want_turn="")
        t.leads_waiting = True  # its doorbell rang while the call ran
        seen: list[str] = []
        def goes_on(output: str) -> bool:
            seen.append(output)
            return True

        rec.takes_leads = goes_on
        await rec.result(_round_last_read(rec, 0), True, "listing 0")
        assert seen == ["listing 0"] and rec.takes_leads is None, "asked once, with the output; then spent"
        assert emits.calls == [3], "the call, its decision and its result: the Leads are taken in the same call"
        assert rec.pending_user == [("lead 0", "lead")] and list(t.leads_taken) == ["l_0"]
        leads = Leads(cast(Any, SimpleNamespace(store=one, owner=one.owner, redis=r)), t, rec)
        assert not leads.waiting() and rec.leads_hint == 0
        evs = [e for e in await logged(js, r, sid) if e["type"] != "lead.saved"]
        assert [e["type"] for e in evs[-5:]] == ["tool.call", "policy.decision", "tool.result", "user.msg",
                                                 "lead.applied"], evs
        assert evs[-1]["lead_ids"] == ["l_0"] and evs[-1]["ts"] == evs[-3]["ts"]
        seqs = [e["seq"] for e in evs[-5:]]
        assert seqs == list(range(seqs[0], seqs[0] + 5)), "no gap, no repeat"

        # The turn would not go on after this output (the progress guard ends it): the Lead waits.
        rec.take_pending()
        await two.fns.lead(sid=sid, principal="p", lead_id="l_1", text="lead 1", client_id="",
                           max_pending=8, owner=two.owner, want_turn="")
        rec.takes_leads = lambda output: False
        await rec.result(_round_last_read(rec, 1), True, "listing 1")
        assert emits.calls == [3, 3] and rec.pending_user == [] and rec.leads_hint == 1
        assert [e["type"] for e in (await logged(js, r, sid))[-1:]] == ["tool.result"]

        # A result recorded on the group's way (pipelined) never takes them: not the round's end.
        rec.takes_leads = lambda output: True
        rec.pipelined = "c2"
        await rec.result(_round_last_read(rec, 2), True, "listing 2")
        await rec.settle()
        assert rec.pending_user == [] and rec.leads_hint == 1

    run(tmp_path, go)
