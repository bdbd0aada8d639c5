"""Whether a turn's first tool result reads the operator's observations (``:observed``), on a
real Redis with the library loaded and a real nats-server.

A result folds the observations waiting (``/observe``'s ``!command`` outputs) in the call that
records it. Before a turn's first record nothing said whether any waited, so that result read
the list every turn: a Redis round trip a turn, for a list that is almost always empty. Now the
call that starts the turn (``cox_send``, ``cox_turn_end``) says how many wait, as every later
record's reply does, and an observation recorded after that rings the doorbell: the drive keeps
a bell rung between two turns for the next one.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from pydantic_ai.messages import ToolCallPart

from cox_runner.doorbell import Doorbell
from cox_runner.drive import observed_at_start
from cox_runner.leases import Drive
from cox_runner.redis.store import Store
from coxswain import events as ev
from coxswain import keys

from .test_outbox_publisher import busy, run
from .test_read_groups import logged, recorder


async def _observe(store: Store, sid: str, text: str) -> None:
    """An operator's observation, recorded as ``Admission.observe`` records it."""
    record = json.dumps({"command": f"echo {text}", "output": text})
    await store.fns.emit(sid=sid, token="", owner=store.owner, ops=[("rpush", keys.OBSERVED, "", record)],
                         events=[ev.body(ev.Observed(sid=sid, turn_id=None, command=f"echo {text}", output=text,
                                                     exit_code=0))])


class CountedRedis:
    """The recorder's Redis, its list reads counted."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.lranges = 0

    async def lrange(self, *args: Any) -> Any:
        self.lranges += 1
        return await self.r.lrange(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.r, name)


def _read_call(rec: Any, k: int) -> ToolCallPart:
    call = ToolCallPart(tool_name="list_dir", args={"path": f"d{k}"}, tool_call_id=f"c{k}")
    rec.defer(ev.ToolCall(**rec.e(), call_id=call.tool_call_id, name="list_dir", args={"path": f"d{k}"}),
              ev.PolicyDecision(**rec.e(), call_id=call.tool_call_id, verdict="allow", actor="policy", reason="a read"),
              ops=[("hset", keys.OPEN_CALLS, call.tool_call_id, "list_dir")])
    rec.open[call.tool_call_id] = call
    return call


def test_a_turn_start_says_how_many_observations_wait(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_obs_start"
        body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
        await one.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body,
                             owner=one.owner)
        await _observe(two, sid, "while idle")
        sent = await one.fns.send(sid=sid, principal="p", message_id="m_1", text="go", mode="", client_id="",
                                  runner="r_1", lease_ms=60_000, turn_id="t_1", owner=one.owner, models="",
                                  agents_md="")
        assert sent["disposition"] == "started" and sent["observed"] == 1
        queued = await one.fns.send(sid=sid, principal="p", message_id="m_2", text="next", mode="queue",
                                    client_id="", runner="r_1", lease_ms=60_000, turn_id="t_x", owner=one.owner,
                                    models="", agents_md="")
        assert queued["disposition"] == "queued"
        await r.delete(keys.session(sid) + keys.OBSERVED)  # the first turn's result took it
        end = ev.body(ev.TurnEnd(sid=sid, turn_id="t_1", outcome="completed", finish_reason="stop"))
        ended = await one.fns.turn_end(sid=sid, token=str(sent["token"]), owner=one.owner, end_body=end,
                                       next_turn_id="t_2", lease_ms=60_000, plan="", handoff="", hold_next="",
                                       agents_md="")
        assert ended["next"] is not None and ended["observed"] == 0
        await _observe(two, sid, "while the second turn runs")
        queued = await one.fns.send(sid=sid, principal="p", message_id="m_3", text="third", mode="queue",
                                    client_id="", runner="r_1", lease_ms=60_000, turn_id="t_y", owner=one.owner,
                                    models="", agents_md="")
        end = ev.body(ev.TurnEnd(sid=sid, turn_id="t_2", outcome="completed", finish_reason="stop"))
        ended = await one.fns.turn_end(sid=sid, token=str(sent["token"]), owner=one.owner, end_body=end,
                                       next_turn_id="t_3", lease_ms=60_000, plan="", handoff="", hold_next="",
                                       agents_md="")
        assert ended["next"] is not None and ended["observed"] == 1

    run(tmp_path, go)


def test_a_first_result_reads_observations_only_when_some_wait(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_obs_first"
        token = await busy(one, sid)
        rec = recorder(one, r, sid, token)
        counted = CountedRedis(r)
        rec.deps.redis = counted
        rec.turn.observed_waiting = False  # the turn's start said none wait, and no bell rang
        await rec.result(_read_call(rec, 0), True, "a\nb")
        assert counted.lranges == 0, "nothing waits: no read before the turn's first record"
        await _observe(two, sid, "now")
        rec.turn.observed_waiting = True  # its doorbell
        await rec.result(_read_call(rec, 1), True, "c")
        assert counted.lranges == 1
        results = [e for e in await logged(js, r, sid) if e["type"] == "tool.result"]
        assert results[0]["observed"] is None
        assert results[1]["observed"] == [{"command": "echo now", "output": "now"}]
        assert await r.llen(keys.session(sid) + keys.OBSERVED) == 0

    run(tmp_path, go)


def test_a_bell_rung_between_two_turns_is_kept_for_the_next() -> None:
    """An observation recorded after the call that started a turn said none waited, while the
    drive had no turn yet (or still the one before): its doorbell must reach the next turn."""
    import asyncio

    async def go() -> None:
        d = Drive(sid="s_1", token="3")
        leases = SimpleNamespace(get=lambda sid: d)
        bell = Doorbell(cast(Any, None), "me", cast(Any, leases), None)
        assert observed_at_start(d, {"observed": 0}) is False
        assert observed_at_start(d, {}) is True, "a start that does not say: read"
        await bell.answer("s_1", "observe")  # no turn: between two turns
        assert observed_at_start(d, {"observed": 0}) is True
        assert observed_at_start(d, {"observed": 0}) is False, "kept for one turn"
        d.turn = cast(Any, SimpleNamespace(observed_waiting=False, ring=lambda: None))
        await bell.answer("s_1", "observe")  # the turn before, ended, still the drive's
        assert d.turn.observed_waiting is True
        assert observed_at_start(d, {"observed": 0}) is True

    asyncio.run(go())
