"""A drive: this runner holding one session's lease and running its turns one after another.

A drive starts when this runner admits a send to an idle session, claims a session whose
runner died, or finishes a person's write (restore, undo) with a message queued meanwhile. It
runs a turn, records its end, and in the same atomic step takes the next waiting message (steered
first, then queued) or lets the session go idle.

Fencing, from the runner's side: every write goes through a Redis function that checks the
token, so a runner whose lease was taken over writes nothing. Besides, the drive keeps a local
deadline (the time it sent its last successful renewal plus most of the lease): when it passes
without a renewal the drive cancels itself (a running command is killed), and a write outside
Redis (a file) asks Redis for the token once more just before it happens. Losing the lease, or
Redis for longer than the store retries a call (a lost reply alone is retried and answered from
the first attempt: see store.py), cancels the drive at once; the lease then lapses and a runner's
takeover ends the turn ``crashed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.exceptions

from coxswain import events as ev
from coxswain import keys, safefs
from coxswain.errors import CoxError, Fenced, describe, logged
from coxswain.ids import new_id
from coxswain.models import Plan

from . import instructions
from .deps import Deps
from .errors import LeaseLost, StopRequested, StoreDown
from .leases import Drive, cancel
from .turn import Ending, Turn, guarded

if TYPE_CHECKING:
    from .recorder import Recorder

TURNS = "cox_runner.loop"
"""The turn machinery: the loop and all it imports (the steps, calls and handlers, the gate, the
recorder, the transcript, the tools' definitions and pydantic-ai under them). A runner imports it
when its first drive starts (:func:`load_turns`), not at start: ~35 MB and most of a fresh
runner's start time that a runner which has run no turn does not need (#23). ``cox up``'s fork
server imports it once for every runner it forks (``cox/forkserver.py``)."""

CRASH_TEXT = ("Cancelled: the runner running this turn stopped before the call finished "
              "(the turn ended as crashed).")


def _expired(deps: Deps) -> Any:
    def on_expire(d: Drive) -> None:
        if d.task is not None and not d.task.done():
            deps.log.error("lease.deadline_passed", sid=d.sid, token=d.token)

    return on_expire


async def load_turns() -> None:
    """Import :data:`TURNS` off the event loop, once (a no-op after). Its import takes ~0.3 s of
    CPU, seconds on a loaded machine: on the loop it would hold the lease renewals of every drive
    this runner holds, as the MCP SDK's did (``workspace.mcp_servers.load_sdk``)."""
    if TURNS not in sys.modules:
        await asyncio.to_thread(importlib.import_module, TURNS)


def start_drive(deps: Deps, d: Drive) -> None:
    """Hold ``d``'s session here and run its turns (a task the process keeps)."""
    deps.leases.hold(d)
    d.task = deps.process.spawn(run_drive(deps, d), f"drive:{d.sid}")


async def finish_op(deps: Deps, d: Drive) -> None:
    """End a person's operation (restore, undo, ``!command``): release the session, or run what
    was queued meanwhile."""
    nxt = await turn_end_call(deps, d, "", "", may_hold=False)
    if nxt is not None:
        start_drive(deps, Drive(sid=d.sid, token=d.token, first=nxt))


async def run_drive(deps: Deps, d: Drive) -> None:
    # Yield once first: the drive is started by the send that took the lease, and that send's
    # 202 (queued behind this task on the loop) goes out before the turn's first read.
    await asyncio.sleep(0)
    log = deps.log.bind(sid=d.sid)
    d.self_fence = deps.settings.runner.self_fence
    d.arm(deps.settings.runner.lease_ms, d.acquired, _expired(deps))
    try:
        nxt = d.first
        if d.crashed is not None:
            # Before the machinery's import: a takeover that only ends a dead turn or operation
            # (a check whose runner died) releases the session at once, not after seconds of it
            # on a loaded machine while a person's "send it again" met 409 busy.
            nxt = await _end_crashed(deps, d)
        if nxt is not None:
            await load_turns()
        while nxt is not None:
            nxt = await _run_turn(deps, d, nxt)
        if d.history is not None and d.files is not None:
            # The session went idle with the transcript whole: its next turn here folds in only
            # what was recorded since (logreader.LogReader.history).
            deps.events.keep(d.sid, d.history, d.files)
    except StoreDown as exc:
        log.warning("drive.store_down", error=str(exc))
        await deps.store.drop_idle()
    except (LeaseLost, Fenced) as exc:
        log.warning("drive.lease_lost", detail=str(exc))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # Redis failed under a read: write nothing more; the lease lapses and a takeover ends the turn.
        log.warning("drive.store_down", error=logged(exc))
        await deps.store.drop_idle()
    except asyncio.CancelledError:
        log.info("drive.cancelled")
        raise
    except Exception as exc:
        log.error("drive.failed", error=logged(exc), exc_info=exc)
        if d.turn is not None:
            # A bug in the turn, not an unknown outcome of turn_end: end it as an error, once.
            with contextlib.suppress(Exception):
                await _end_turn(deps, d, Ending("error", detail=f"internal error: {describe(exc)}"), None)
    finally:
        d.disarm()
        deps.leases.release(d)
        if d.mcp is not None:  # the session's MCP servers stop with the drive
            await d.mcp.aclose()
        if d.turn is not None:  # the next drive hands the workspace to the sandbox user again first
            deps.sandbox.forget(d.turn.workspace)


def observed_at_start(d: Drive, msg: dict[str, Any]) -> bool:
    """Whether the turn ``msg`` begins reads the operator's observations at its first result:
    the call that started it said some waited (``observed``; a start that does not say, a
    takeover's or a resumed one's, reads), or an observation's doorbell rang since the drive's
    last turn began. Later results know from their records' replies and the doorbell."""
    rung, d.observe_rung = d.observe_rung, False
    said = msg.get("observed")
    return rung or said is None or bool(said)


async def _run_turn(deps: Deps, d: Drive, msg: dict[str, Any]) -> dict[str, Any] | None:
    """Run the turn ``msg`` began, end it, and answer what starts next (None: the session is idle
    or handed on)."""
    from .gate import running_run  # the turn machinery: loaded by run_drive (load_turns)
    from .loop import TurnLoop
    from .workspace.mcp_servers import McpServers

    # The whole session once, here: the loop's load takes its plan and title from it too.
    info = msg.get("info") or await deps.redis.hgetall(keys.session(d.sid))
    turn = Turn(
        sid=d.sid, turn_id=msg["turn_id"], token=d.token, message_id=msg["message_id"], text=msg["text"],
        via=msg.get("mode") or "send", workspace=Path(info.get("workspace") or "."),
        model=info.get("model") or "script", info=info, attachments=list(msg.get("attachments") or []),
        fresh=bool(msg.get("fresh")), leads_taken=d.leads_taken,
    )
    turn.observed_waiting = observed_at_start(d, msg)
    if d.mcp is None and deps.settings.mcp.enabled():
        d.mcp = McpServers(deps.settings, deps.sandbox, deps.log.bind(sid=d.sid))
    turn.mcp = d.mcp
    d.turn = turn
    deps.log.info("turn.begin", sid=d.sid, turn_id=turn.turn_id, message_id=turn.message_id, token=d.token,
                  model=turn.model)
    if d.shutting_down:
        turn.request_stop("shutdown")
    # The session as read above has the stop flag; a Stop or steer rung since (while no turn ran
    # here, so the doorbell could stop none) is read again. From here on a doorbell finds d.turn.
    stop = info.get("stop")
    if d.stop_rung:
        d.stop_rung = False
        stop = await deps.redis.hget(keys.session(d.sid), "stop")
    if stop:
        turn.request_stop(stop)
    slot = running_run(info) is not None
    if slot:
        # A run turn waits for one of the stack's [runs] max_active slots (queued, never failed);
        # Stop or shutdown meanwhile ends it at once (the loop sees the stop before any request).
        t0 = time.monotonic()
        with contextlib.suppress(StopRequested):
            await guarded(turn, deps.run_slots.acquire(d.sid, d.token))
        waited = time.monotonic() - t0
        if waited > 0.05:
            deps.log.info("run.slot_waited", sid=d.sid, turn_id=turn.turn_id, waited_s=round(waited, 3))
        turn.started = time.monotonic()  # the wait is not the turn's work time
    nxt: Any = GOES_ON  # the turn has not ended yet
    try:
        loop = TurnLoop(deps, turn, carried=d.history)
        d.history = None
        deps.leases.turns_started += 1
        ending = await loop.run()
        while loop.rec.closing:
            # The final response is recorded by the turn's end (one call, not two); a Lead saved
            # before it is applied and the turn goes on (still under its run slot).
            nxt = await _end_turn(deps, d, ending, loop.plan.plan, loop.rec)
            if nxt is not GOES_ON:
                break
            deps.log.info("turn.leads_at_end", sid=d.sid, turn_id=turn.turn_id)
            ending = await loop.resume()
    finally:
        if slot:
            deps.run_slots.release(d.sid)
    d.history = loop.handed_on()
    d.files = loop.files
    if nxt is GOES_ON:  # nothing carried: the turn ends here, and no close can fail
        nxt = await _end_turn(deps, d, ending, loop.plan.plan)
    ended: dict[str, Any] | None = nxt
    return ended


GOES_ON = object()
""":func:`turn_end_call`'s answer when the final record it carried found a Lead waiting: the turn
did not end (its Leads are applied and it goes on)."""


def _plan_action(ending: Ending, plan: Plan | None) -> str:
    """'' keeps the session's plan (carried into the next turn), '-' clears it."""
    if ending.outcome not in ev.UNFINISHED or plan is None:
        return "-"
    if len(set(plan.marks)) >= len(plan.steps):
        return "-"
    return ""


OPEN_CALLS = "open_calls"
"""cox_turn_end's refusal while a call of the turn has no result (the library's own: never a
client's error, so not one of :mod:`coxswain.errors`' codes)."""


async def _end_turn(deps: Deps, d: Drive, ending: Ending, plan: Plan | None,
                    rec: Recorder | None = None) -> Any:
    turn = d.turn
    if turn is None:
        return None
    body = ev.body(ev.TurnEnd(sid=d.sid, turn_id=turn.turn_id, outcome=ending.outcome,
                              finish_reason=ending.finish_reason, detail=ending.detail,
                              provider_finish_reason=ending.provider_finish_reason))
    deps.log.info("turn.end", sid=d.sid, turn_id=turn.turn_id, outcome=ending.outcome)
    try:
        # The library refuses while a call of the turn is open, so the usual end (every call
        # closed by the loop) reads nothing before it.
        return await turn_end_call(deps, d, body, _plan_action(ending, plan), pause=ending.pause, rec=rec)
    except CoxError as exc:
        if exc.code != OPEN_CALLS:
            raise
    if await _close_open_calls(deps, d, turn, ending):
        d.history = None  # results the loop never saw: the next turn rebuilds from the log
    return await turn_end_call(deps, d, body, _plan_action(ending, plan), pause=ending.pause, rec=rec)


async def _close_open_calls(deps: Deps, d: Drive, turn: Turn, ending: Ending) -> bool:
    """Whatever path ended the turn, no tool call it opened stays without a result.

    The loop closes the calls it knows about; this catches any it could not (an exception
    between a response and its tool round). ``:open`` is a small hash, so HGETALL gives the
    calls in the order the response listed them.
    """
    flat = await deps.redis.hgetall(keys.of(d.sid, keys.OPEN_CALLS))
    if not flat:
        return False
    call_ids = list(flat)
    landed, cleanup = await _settle_writes(deps, d.sid, turn.turn_id, ending.outcome)
    reason = turn.stop_reason if turn.stop_reason in ("stop", "steer") else None
    evs: list[ev._Event] = []
    text = f"Cancelled: the turn ended ({ending.outcome}) before this call finished."
    for c in call_ids:
        if c in landed:
            evs += landed[c]
        elif reason is not None:
            evs.append(ev.ToolSkipped(sid=d.sid, turn_id=turn.turn_id, call_id=c, reason=reason))
        else:
            evs.append(ev.ToolResult(sid=d.sid, turn_id=turn.turn_id, call_id=c, ok=False, output=text))
    ops = [*(("hdel", keys.OPEN_CALLS, c, "") for c in call_ids), ("del", keys.WRITES, "", "")]
    try:
        await deps.store.fns.emit(sid=d.sid, token=d.token, owner=deps.owner, ops=ops,
                                  events=[ev.body(e) for e in evs])
    except Fenced as exc:
        raise LeaseLost(str(exc)) from exc
    if cleanup is not None:
        await cleanup()
    deps.log.warning("turn.closed_open_calls", sid=d.sid, turn_id=turn.turn_id, calls=call_ids)
    return True


async def turn_end_call(deps: Deps, d: Drive, body: str, plan: str, may_hold: bool = True,
                        pause: str = "", rec: Recorder | None = None) -> Any:
    """End the turn (``body``) and take the next waiting message, or go idle (``pause``: a daily
    budget the turn reached pauses the session: nothing starts, its messages wait).

    With ``rec`` holding the turn's final record (:attr:`Recorder.closing
    <cox_runner.recorder.Recorder.closing>`), the same call records it first and closes Lead
    admission with it; a Lead waiting then, the turn does not end: :data:`GOES_ON`.

    While the services a turn needs do not answer (the bus is down, guard or versions is gone),
    the next message is not started, since it could only fail: the session is held (busy, under
    this drive's lease, its messages waiting in order) until they answer (:func:`_hold`).
    """
    next_turn = new_id("t")
    handoff = "1" if (d.shutting_down or deps.process.stopping) else ""
    hold = "1" if may_hold and not handoff and await deps.health.missing() is not None else ""
    ws = str(d.turn.workspace) if d.turn is not None else await deps.redis.hget(keys.session(d.sid), "workspace")
    agents = await instructions.agents_md_hash(ws)  # for the next turn's turn.start, if one starts
    lease_ms = deps.settings.runner.lease_ms
    carry = rec if rec is not None and rec.closing else None
    events, ops = carry.deferred() if carry is not None else ([], [])
    sent = time.monotonic()
    try:
        res = await deps.store.fns.turn_end(
            sid=d.sid, token=d.token, owner=deps.owner, end_body=body, next_turn_id=next_turn, lease_ms=lease_ms,
            plan=plan, handoff=handoff, hold_next=hold, agents_md=agents, pause=pause, ops=ops, events=events,
        )
    except Fenced as exc:
        raise LeaseLost(str(exc)) from exc
    if carry is not None:
        carry.carried(int(res.get("last") or 0), not res.get("goes_on"), int(res.get("leads") or 0))
        if res.get("goes_on"):
            return GOES_ON
    d.turn = None
    msg = res.get("next")
    if isinstance(msg, dict):
        d.arm(lease_ms, sent)  # the call renewed the lease for the next turn
        return {**msg, "turn_id": res.get("turn_id", next_turn), "info": res.get("info"), "fresh": bool(res.get("fresh")),
                "observed": res.get("observed")}
    if res.get("held"):
        d.arm(lease_ms, sent)
        return await _hold(deps, d)
    return None


async def _hold(deps: Deps, d: Drive) -> dict[str, Any] | None:
    """Keep the session, start nothing, until the services a turn needs answer again (or Stop,
    which discarded the waiting messages, or this runner shuts down and hands the session on).
    The lease is renewed meanwhile like any drive's; nothing is bounded here because nothing is
    consumed: the messages wait in Redis, in order."""
    t0 = time.monotonic()
    missing = await deps.health.missing()
    deps.log.warning("drive.holding", sid=d.sid, missing=missing)
    pause = 0.05
    while missing is not None:
        if d.shutting_down or deps.process.stopping:
            break
        if await deps.redis.hget(keys.session(d.sid), "stop") == "stop":
            break
        await asyncio.sleep(pause)
        pause = min(1.0, pause * 2)
        missing = await deps.health.missing()
    deps.log.info("drive.resumed", sid=d.sid, held_s=round(time.monotonic() - t0, 3), missing=missing)
    nxt: dict[str, Any] | None = await turn_end_call(deps, d, "", "", may_hold=False)
    return nxt


async def _end_crashed(deps: Deps, d: Drive) -> dict[str, Any] | None:
    """Close the dead turn's open calls, end it ``crashed`` (its plan carries), go on."""
    c = d.crashed or {}
    turn_id = c.get("turn_id") or ""
    body = ""
    if turn_id:
        flat = c.get("open") or []
        open_calls = list(zip(flat[::2], flat[1::2], strict=False)) if isinstance(flat, list) else []
        # Settled first: a write the dead runner staged either landed (recorded as written) or
        # never will (its temp file is renamed away before anything of the next turn runs).
        landed, cleanup = await _settle_writes(deps, d.sid, turn_id, "crashed")
        if open_calls:
            evs: list[ev._Event] = []
            for cid, _name in open_calls:
                evs += landed.get(cid) or [ev.ToolResult(sid=d.sid, turn_id=turn_id, call_id=cid, ok=False,
                                                         output=CRASH_TEXT)]
            try:
                await deps.store.fns.emit(sid=d.sid, token=d.token, owner=deps.owner,
                                          ops=[("del", keys.OPEN_CALLS, "", ""), ("del", keys.WRITES, "", "")],
                                          events=[ev.body(e) for e in evs])
            except Fenced as exc:
                raise LeaseLost(str(exc)) from exc
        if cleanup is not None:
            await cleanup()
        detail = f"the runner {c.get('old_runner') or '?'} stopped renewing its lease"
        body = ev.body(ev.TurnEnd(sid=d.sid, turn_id=turn_id, outcome="crashed", detail=detail))
        deps.log.warning("turn.crashed", sid=d.sid, turn_id=turn_id, old_runner=c.get("old_runner"))
    nxt: dict[str, Any] | None = await turn_end_call(deps, d, body, "")
    return nxt


async def renew_all(deps: Deps) -> None:
    """Renew every lease this runner holds (one pipeline) and pass on what changed.

    The reply to a renewal may come late (Redis slow or gone); the pipeline is bounded by the
    renewal period, and a drive whose deadline passes meanwhile stops itself (``Drive.arm``).
    """
    drives = deps.leases.active()
    if not drives:
        return
    rc = deps.settings.runner
    lease_ms = rc.lease_ms
    sent = time.monotonic()
    # One pipeline per Redis master (one in all without a cluster): a master that died fails the
    # renewals of its sessions only.
    groups: dict[str, list[Drive]] = {}
    for d in drives:
        groups.setdefault(deps.store.node_of(keys.session(d.sid)), []).append(d)

    async def renew(group: list[Drive]) -> list[Any]:
        try:
            async with deps.redis.pipeline(transaction=False) as pipe:
                for d in group:
                    deps.store.fns.renew(pipe, sid=d.sid, token=d.token, lease_ms=lease_ms)
                return list(await asyncio.wait_for(pipe.execute(raise_on_error=False),
                                                   timeout=rc.renew_every_ms / 1000))
        except Exception as exc:  # noqa: BLE001 - Redis down or slow: the deadlines decide
            deps.log.warning("lease.renew_failed", error=logged(exc), drives=len(group))
            await deps.store.drop_idle()
            return [None] * len(group)

    replies = await asyncio.gather(*(renew(g) for g in groups.values()))
    drives = [d for g in groups.values() for d in g]
    results = [r for rs in replies for r in rs]
    for d, res in zip(drives, results, strict=True):
        if res is None:
            continue
        if isinstance(res, Exception):
            deps.log.warning("lease.renew_failed", sid=d.sid, error=repr(res))
            continue
        head = json.loads(res[0])
        if "error" in head:
            deps.log.warning("lease.lost", sid=d.sid, detail=head.get("detail"))
            cancel(d)
            continue
        if deps.leases.get(d.sid) is d:
            d.arm(lease_ms, sent)
        take_renewal(d, head)


def take_renewal(d: Drive, head: dict[str, Any]) -> None:
    """Pass on what a renewal read to the drive's turn, when it was read for that turn: a reply
    that comes after the turn ended (late, or read just before the end) would stop the next one
    with the steer that started it. The next turn reads the flags itself when it begins."""
    t = d.turn
    if t is None or head.get("turn_id") != t.turn_id:
        return
    if head.get("stop"):
        t.request_stop(head["stop"])
    if head.get("leads"):
        t.lead_rang(head.get("lead_last"))
    if head.get("observed"):
        t.observed_waiting = True
    if t.policy_inputs is not None and t.policy_inputs[1] != bool(head.get("dont_ask")):
        t.policy_inputs = None


async def _settle_writes(deps: Deps, sid: str, turn_id: str, outcome: str) -> tuple[dict[str, list[ev._Event]], Any]:
    """Settle the file writes a turn staged and fenced but never recorded (its runner stopped).

    Each is made final one way or the other on the file system, atomically: the staged temp file
    is renamed away (the write never landed, and a paused writer's rename now fails), or it is
    gone because the writer's rename ran (the write landed: the log must say so). Returns the
    events recording the writes that landed, by call id, and a cleanup to run once they are
    recorded (it removes the renamed-away temp files).
    """
    wip = await deps.redis.hgetall(keys.of(sid, keys.WRITES))
    if not wip:
        return {}, None
    ws = Path(await deps.redis.hget(keys.session(sid), "workspace") or ".")
    landed: dict[str, list[ev._Event]] = {}
    staged: list[tuple[str, str]] = []
    for call_id, raw in wip.items():
        try:
            w = json.loads(raw)
            path, tmp = str(w["path"]), str(w["tmp"])
            aborted = await asyncio.to_thread(safefs.abort, ws, path, tmp)
        except Exception as exc:  # noqa: BLE001 - unreadable intent or folder: it did not land as far as we can tell
            deps.log.error("write.unsettled", sid=sid, call_id=call_id, error=logged(exc))
            continue
        staged.append((path, tmp))
        deps.log.warning("write.settled", sid=sid, call_id=call_id, path=path, landed=not aborted)
        if not aborted:
            landed[call_id] = [
                ev.VersionKept(sid=sid, turn_id=turn_id, path=w.get("kept_path") or path,
                               version_id=w["version_id"], store=w["store"]),
                ev.FileWritten(sid=sid, turn_id=turn_id, path=path, added=int(w.get("added", 0)),
                               removed=int(w.get("removed", 0))),
                ev.ToolResult(sid=sid, turn_id=turn_id, call_id=call_id, ok=True,
                              output=f"Wrote {path} ({w.get('bytes', 0)} bytes, +{w.get('added', 0)} "
                                     f"-{w.get('removed', 0)}); the turn then ended ({outcome})."),
            ]

    async def cleanup() -> None:
        for path, tmp in staged:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(safefs.discard, ws, path, tmp)

    return landed, cleanup
