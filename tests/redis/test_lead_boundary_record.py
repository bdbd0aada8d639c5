"""A Lead applied at a safe boundary in the boundary's own record (:meth:`cox_runner.leads.Leads.boundary`),
on a real Redis with the library loaded and a real nats-server.

The unstarted calls' skips, whatever waited to be recorded before them (a response recorded with
its first read's record), the Leads' user messages and ``lead.applied`` go in one Redis call and
one publish, in that order: the Lead is in the log with the boundary, not a round trip after it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from pydantic_ai.messages import ToolCallPart

from cox_runner.leads import Leads
from cox_runner.redis.store import Store
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
