"""A drive: this runner holding one session's lease and running its turns one after another.

A drive starts when this runner admits a send to an idle session, claims a session whose
runner died, or finishes a person's write (restore, undo) with a message queued meanwhile. It
runs a turn, records its end, and in the same atomic step takes the next waiting message (steered
first, then queued) or lets the session go idle. Losing the lease cancels the drive at once: a
fenced runner writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coxswain import events as ev
from coxswain import keys
from coxswain.errors import CoxError, Fenced
from coxswain.ids import new_id

from .errors import LeaseLost
from .loop import Ending, TurnLoop
from .turn import Turn

if TYPE_CHECKING:
    from .service import Runner

CRASH_TEXT = ("Cancelled: the runner running this turn stopped before the call finished "
              "(the turn ended as crashed).")


@dataclass
class Drive:
    sid: str
    token: str
    first: dict[str, Any] | None = None
    """The message to run first: {message_id, text, mode, turn_id}."""
    crashed: dict[str, Any] | None = None
    """A claimed session's dead turn: {turn_id, open: [call_id, name, ...], old_runner}."""
    turn: Turn | None = None
    task: asyncio.Task[None] | None = None
    last_renewed: float = field(default_factory=time.monotonic)
    shutting_down: bool = False


async def run_drive(runner: Runner, d: Drive) -> None:
    log = runner.log.bind(sid=d.sid)
    try:
        nxt = d.first
        if d.crashed is not None:
            nxt = await _end_crashed(runner, d)
        while nxt is not None:
            ending, plan = await _run_turn(runner, d, nxt)
            nxt = await _end_turn(runner, d, ending, plan)
    except (LeaseLost, Fenced):
        log.warning("drive.lease_lost")
    except asyncio.CancelledError:
        log.info("drive.cancelled")
        raise
    except Exception as exc:
        log.error("drive.failed", error=repr(exc), exc_info=exc)
        with contextlib.suppress(Exception):
            await _end_turn(runner, d, Ending("error", detail=f"internal error: {exc!r}"), None, force=True)
    finally:
        runner.drives.pop(d.sid, None)


async def _run_turn(runner: Runner, d: Drive, msg: dict[str, Any]) -> tuple[Ending, dict[str, Any] | None]:
    info = await runner.redis.hmget(keys.session(d.sid), ["workspace", "model"])
    turn = Turn(
        sid=d.sid, turn_id=msg["turn_id"], token=d.token, message_id=msg["message_id"], text=msg["text"],
        via=msg.get("mode") or "send", workspace=Path(info[0] or "."), model=info[1] or "script",
    )
    d.turn = turn
    if d.shutting_down:
        turn.request_stop("shutdown")
    stop = await runner.redis.hget(keys.session(d.sid), "stop")
    if stop:
        turn.request_stop(stop)
    loop = TurnLoop(runner, turn)
    runner.metrics_turn_started()
    ending = await loop.run()
    return ending, loop.plan


def _plan_action(ending: Ending, plan: dict[str, Any] | None) -> str:
    """'' keeps the session's plan (carried into the next turn), '-' clears it."""
    if ending.outcome not in ev.UNFINISHED or not plan:
        return "-"
    if len(set(plan.get("marks", []))) >= len(plan.get("steps", [])):
        return "-"
    return ""


async def _end_turn(runner: Runner, d: Drive, ending: Ending, plan: dict[str, Any] | None,
                    force: bool = False) -> dict[str, Any] | None:
    turn = d.turn
    if turn is None and not force:
        return None
    body = ""
    if turn is not None:
        body = ev.body(ev.TurnEnd(sid=d.sid, turn_id=turn.turn_id, outcome=ending.outcome,
                                  finish_reason=ending.finish_reason, detail=ending.detail,
                                  provider_finish_reason=ending.provider_finish_reason))
    runner.log.info("turn.end", sid=d.sid, turn_id=turn.turn_id if turn else None, outcome=ending.outcome)
    return await _turn_end_call(runner, d, body, _plan_action(ending, plan))


async def _turn_end_call(runner: Runner, d: Drive, body: str, plan: str) -> dict[str, Any] | None:
    next_turn = new_id("t")
    handoff = "1" if (d.shutting_down or runner.stopping) else ""
    res = await runner.store.call("cox_turn_end", d.sid, [
        d.sid, d.token, runner.owner, body, next_turn, str(runner.settings.runner.lease_ms), plan, handoff,
    ])
    d.turn = None
    msg = res.get("next")
    if isinstance(msg, dict):
        return {**msg, "turn_id": res.get("turn_id", next_turn)}
    return None


async def _end_crashed(runner: Runner, d: Drive) -> dict[str, Any] | None:
    """Close the dead turn's open calls, end it ``crashed`` (its plan carries), go on."""
    c = d.crashed or {}
    turn_id = c.get("turn_id") or ""
    body = ""
    if turn_id:
        flat = c.get("open") or []
        open_calls = list(zip(flat[::2], flat[1::2], strict=False)) if isinstance(flat, list) else []
        if open_calls:
            evs = [ev.ToolResult(sid=d.sid, turn_id=turn_id, call_id=cid, ok=False, output=CRASH_TEXT)
                   for cid, _name in open_calls]
            await runner.store.call("cox_emit", d.sid, [
                d.sid, d.token, runner.owner, "1", "del", ":open", "", "", *(ev.body(e) for e in evs),
            ])
        detail = f"the runner {c.get('old_runner') or '?'} stopped renewing its lease"
        body = ev.body(ev.TurnEnd(sid=d.sid, turn_id=turn_id, outcome="crashed", detail=detail))
        runner.log.warning("turn.crashed", sid=d.sid, turn_id=turn_id, old_runner=c.get("old_runner"))
    return await _turn_end_call(runner, d, body, "")


def parse_claims(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        raw = json.loads(raw)
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


async def renew_all(runner: Runner) -> None:
    """Renew every lease this runner holds (one pipeline) and pass on what changed."""
    drives = list(runner.drives.values())
    if not drives:
        return
    lease_ms = runner.settings.runner.lease_ms
    try:
        async with runner.redis.pipeline(transaction=False) as pipe:
            for d in drives:
                pipe.fcall("cox_renew", 1, keys.session(d.sid), d.sid, d.token, str(lease_ms))
            results = await pipe.execute(raise_on_error=False)
    except Exception as exc:  # noqa: BLE001 - Redis down: self-fence below
        runner.log.warning("lease.renew_failed", error=repr(exc))
        results = [exc] * len(drives)
    now = time.monotonic()
    for d, res in zip(drives, results, strict=True):
        if isinstance(res, Exception):
            if now - d.last_renewed > lease_ms / 1000:
                runner.log.error("lease.deadline_passed", sid=d.sid)
                _cancel(d)
            continue
        head = json.loads(res[0])
        if "error" in head:
            runner.log.warning("lease.lost", sid=d.sid, detail=head.get("detail"))
            _cancel(d)
            continue
        d.last_renewed = now
        t = d.turn
        if t is None:
            continue
        if head.get("stop"):
            t.request_stop(head["stop"])
        if head.get("leads"):
            t.leads_waiting = True
            t.ring()
        if head.get("observed"):
            t.observed_waiting = True


def _cancel(d: Drive) -> None:
    if d.task is not None and not d.task.done():
        d.task.cancel()


async def ring_local(runner: Runner, sid: str, kind: str) -> None:
    """A doorbell for a session this runner holds: re-read what changed."""
    d = runner.drives.get(sid)
    if d is None or d.turn is None:
        return
    t = d.turn
    if kind in ("stop", "steer"):
        with contextlib.suppress(CoxError, OSError):
            stop = await runner.redis.hget(keys.session(sid), "stop")
            if stop:
                t.request_stop(stop)
    elif kind == "lead":
        t.leads_waiting = True
        t.ring()
    elif kind == "observe":
        t.observed_waiting = True
        t.ring()
    else:
        t.ring()
