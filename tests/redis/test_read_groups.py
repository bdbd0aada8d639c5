"""A group of reads recorded while the turn goes on (:meth:`cox_runner.recorder.Recorder.result`
with ``pipelined``), on a real Redis with the library loaded and a real nats-server.

A response of several reads used to wait for each read's record (one Redis call and one publish
each) before the next read ran. A read changes nothing, so its record may be on its way while
the next read runs; what is recorded meanwhile goes with the next Redis call, in order, and
results wait a moment (the linger) for the ones behind them. What must hold: the log reads every
call's start, decision and result in order and without a gap; a record the fence refuses stops
the turn at the next result (not after the reads to come) and puts nothing in the log; anything
that is not such a read waits for every record before it, and does not wait out the linger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic_ai.messages import ToolCallPart

from cox_runner import recorder as recorder_module
from cox_runner.errors import LeaseLost
from cox_runner.recorder import Recorder
from cox_runner.redis.store import Store
from cox_runner.turn import Turn
from coxswain import eventlog, keys
from coxswain import events as ev

from .test_outbox_publisher import busy, drained, run


def recorder(store: Store, r: Any, sid: str, token: str) -> Recorder:
    turn = Turn(sid=sid, turn_id="t_1", token=token, message_id="m_1", text="go", via="send",
                workspace=Path("/w"), model="script")
    deps = SimpleNamespace(store=store, owner=store.owner, redis=r)
    return Recorder(cast(Any, deps), turn)


def holding(store: Store, r: Any, sid: str, token: str) -> tuple[Recorder, HeldEmits]:
    """A turn's recorder whose every record is held on its way until released."""
    return recorder(store, r, sid, token), HeldEmits(store)


class HeldEmits:
    """The store's ``emit``, counted, each call held until :meth:`release`: a record on its way."""

    def __init__(self, store: Store) -> None:
        self.real = store.fns.emit
        self.calls: list[int] = []
        self.gate = asyncio.Event()
        store.fns.emit = self  # type: ignore[method-assign]

    async def __call__(self, **kw: Any) -> Any:
        self.calls.append(len(kw["events"]))
        await self.gate.wait()
        return await self.real(**kw)

    def release(self) -> None:
        self.gate.set()


async def read(rec: Recorder, k: int, pipelined: bool, output: str = "") -> None:
    """One read as the tool round records it: its start deferred, its result (with its decision)."""
    call = ToolCallPart(tool_name="list_dir", args={"path": f"d{k}"}, tool_call_id=f"c{k}")
    rec.defer(ev.ToolCall(**rec.e(), call_id=call.tool_call_id, name="list_dir", args={"path": f"d{k}"}),
              ev.PolicyDecision(**rec.e(), call_id=call.tool_call_id, verdict="allow", actor="policy", reason="a read"))
    rec.pipelined = call.tool_call_id if pipelined else None
    await rec.result(call, True, output or f"listing {k}")
    await asyncio.sleep(0)  # the next read's hop to a thread: a record due goes out


async def logged(js: Any, r: Any, sid: str) -> list[dict[str, Any]]:
    """The session's log as the stream has it, once the outbox is published."""
    await drained(r, sid)
    return await eventlog.backlog(js, sid, 0, int(await r.hget(keys.session(sid), "seq")), timeout=5.0)


def test_reads_recorded_on_the_way_go_out_in_order_in_fewer_calls(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A linger the ten reads fit in on a loaded CI machine (5 ms did not, once: the parallel lane
    # runs at a quarter of the drills' CPU weight); what lingers goes out when it ends all the same.
    monkeypatch.setattr(recorder_module, "PIPELINE_LINGER_S", 0.25)

    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_group"
        rec, emits = holding(one, r, sid, await busy(one, sid))
        for k in range(10):
            await read(rec, k, pipelined=True)
        assert emits.calls == [], "the results linger for the ones behind them"
        loop = asyncio.get_running_loop()
        until = loop.time() + recorder_module.PIPELINE_LINGER_S * 10
        while not emits.calls and loop.time() < until:
            await asyncio.sleep(0.01)
        assert emits.calls == [30], "one record of the ten reads, on its way (held)"
        for k in range(10, 15):
            await read(rec, k, pipelined=True)  # the reads go on while it is on its way
        assert emits.calls == [30]
        emits.release()
        await read(rec, 15, pipelined=False)  # the last read before anything else: waits for all
        assert emits.calls == [30, 15, 3], emits.calls
        evs = [e for e in await logged(js, r, sid) if e["type"] in ("tool.call", "policy.decision", "tool.result")]
        assert [e["type"] for e in evs] == ["tool.call", "policy.decision", "tool.result"] * 16
        assert [e["call_id"] for e in evs[::3]] == [f"c{k}" for k in range(16)]
        seqs = [e["seq"] for e in evs]
        assert seqs == list(range(seqs[0], seqs[0] + 48)), "no gap, no repeat"

    run(tmp_path, go)


def test_a_group_past_its_size_goes_out_without_the_linger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Results that make a record big enough (events, or read output) go out at once; a linger
    longer than the test shows nothing else sends them."""
    monkeypatch.setattr(recorder_module, "PIPELINE_LINGER_S", 60.0)
    monkeypatch.setattr(recorder_module, "PIPELINE_MAX_EVENTS", 9)
    monkeypatch.setattr(recorder_module, "PIPELINE_MAX_CHARS", 1000)

    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_full"
        rec, emits = holding(one, r, sid, await busy(one, sid))
        emits.release()
        await read(rec, 0, pipelined=True)
        await read(rec, 1, pipelined=True)
        await asyncio.sleep(0.05)
        assert emits.calls == [], "two reads (six events) linger"
        await read(rec, 2, pipelined=True)  # nine events
        await asyncio.sleep(0.05)
        assert emits.calls == [9]
        await read(rec, 3, pipelined=True, output="x" * 1000)  # one read of much output
        await asyncio.sleep(0.05)
        assert emits.calls == [9, 3]
        await rec.settle()
        evs = [e for e in await logged(js, r, sid) if e["type"] in ("tool.call", "policy.decision", "tool.result")]
        assert [e["call_id"] for e in evs[::3]] == ["c0", "c1", "c2", "c3"] and len(evs) == 12

    run(tmp_path, go)


def test_a_refused_record_stops_the_turn_at_the_next_read_and_logs_nothing(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_refused"
        await busy(one, sid)
        await drained(r, sid)
        before = int(await r.hget(keys.session(sid), "seq"))
        rec, emits = holding(one, r, sid, "999999")  # not the lease's token: the fence refuses it
        await read(rec, 0, pipelined=True)
        emits.release()
        for _ in range(100):  # the refusal comes back while the reads go on
            await asyncio.sleep(0.01)
            if rec._flushing is not None and rec._flushing.done():
                break
        assert rec._flushing is not None and rec._flushing.done(), "the refusal came back"
        with pytest.raises(LeaseLost):
            await read(rec, 1, pipelined=True)
        with pytest.raises(LeaseLost):
            await rec.settle()  # and the turn's end (which settles first) is refused too
        assert int(await r.hget(keys.session(sid), "seq")) == before, "nothing of the stale turn in the log"

    run(tmp_path, go)


def test_anything_else_waits_for_the_reads_on_their_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An event recorded the usual way (a write's record, the response, the turn's end) goes
    after every pipelined result: ``emit`` settles first, and sends what lingers at once (a
    linger longer than the test: only the settle sends it)."""
    monkeypatch.setattr(recorder_module, "PIPELINE_LINGER_S", 60.0)

    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_after"
        rec, emits = holding(one, r, sid, await busy(one, sid))
        for k in range(3):
            await read(rec, k, pipelined=True)
        await asyncio.sleep(0.05)
        assert emits.calls == [], "lingering"
        other = asyncio.ensure_future(rec.emit(ev.AgentMessage(**rec.e(), text="after the reads")))
        await asyncio.sleep(0.05)
        assert not other.done() and emits.calls == [9], "held behind the reads' record, sent at once"
        emits.release()
        await other
        assert emits.calls == [9, 1]
        evs = await logged(js, r, sid)
        assert evs[-1]["type"] == "agent.message" and evs[-2]["type"] == "tool.result" and evs[-2]["call_id"] == "c2"

    run(tmp_path, go)


def test_a_text_chunk_goes_out_behind_the_streams_back_and_the_last_with_the_response(tmp_path: Path) -> None:
    """The text chunks of a streaming response (``assistant.delta``, every 50 ms) change nothing,
    so their records linger and go out while the stream goes on (:meth:`Recorder.linger`), not
    with the stream waiting on each. A chunk still lingering when the stream ends is taken back
    (:meth:`Recorder.take_lingering`) and goes with the response's own record: one Redis call,
    not two one after the other, at the turn's end. Order and gaplessness hold either way."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_deltas"
        rec, emits = holding(one, r, sid, await busy(one, sid))
        rec.linger(ev.AssistantDelta(**rec.e(), text="one "))
        assert emits.calls == [], "the stream goes on: nothing waited for"
        await asyncio.sleep(recorder_module.PIPELINE_LINGER_S * 10)
        assert emits.calls == [1], "it went out on its own (held on its way)"
        rec.linger(ev.AssistantDelta(**rec.e(), text="two "))  # while the first is on its way
        rec.take_lingering()
        emits.release()
        await asyncio.sleep(recorder_module.PIPELINE_LINGER_S * 10)
        assert emits.calls == [1], "taken back: it waits for the next record"
        rec.linger(ev.AssistantDelta(**rec.e(), text="three "))
        rec.take_lingering()  # the stream ended at once
        rec.defer(ev.AssistantDelta(**rec.e(), text="four"))
        await rec.emit(ev.AssistantMsg(**rec.e(), text="one two three four", finish_reason="stop"))
        assert emits.calls == [1, 4], "the last chunks and the response in one record"
        await rec.settle()
        evs = [e for e in await logged(js, r, sid) if e["type"] in ("assistant.delta", "assistant.msg")]
        assert [e.get("text") for e in evs] == ["one ", "two ", "three ", "four", "one two three four"]
        seqs = [e["seq"] for e in evs]
        assert seqs == list(range(seqs[0], seqs[0] + 5)), "no gap, no repeat"

    run(tmp_path, go)


def test_a_chunk_taken_back_with_nothing_after_it_still_reaches_the_log(tmp_path: Path) -> None:
    """A chunk taken back when the stream broke off (a failed request, Stop) goes with whatever
    the turn records next; the turn's end settles first, so it is never left out."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_delta_end"
        rec, emits = holding(one, r, sid, await busy(one, sid))
        emits.release()
        rec.linger(ev.AssistantDelta(**rec.e(), text="half"))
        rec.take_lingering()
        await rec.settle()
        assert emits.calls == [] and rec.has_deferred, "settled: nothing on its way, the chunk deferred"
        await rec.emit()
        assert emits.calls == [1]
        evs = [e for e in await logged(js, r, sid) if e["type"] == "assistant.delta"]
        assert [e["text"] for e in evs] == ["half"]

    run(tmp_path, go)
