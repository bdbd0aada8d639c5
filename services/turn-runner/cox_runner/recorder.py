"""A turn's events out: everything a turn records goes through its :class:`Recorder`.

Every call is fenced by the turn's token (a Redis function that checks the lease), so a runner
whose lease passed on records nothing. The recorder also keeps what recording implies for the
turn itself: which calls of the latest response are still open (each gets a result or a skip on
every way out), the transcript the next model request is built from, the user messages recorded
but not yet sent, and what Redis said waits (Leads, operator observations) on its last answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from pydantic_ai.messages import ToolCallPart

from coxswain import events as ev
from coxswain import keys
from coxswain.errors import Fenced

from . import spending, transcript
from .deps import Deps
from .errors import LeaseLost
from .redis.fns import Emitted
from .turn import Turn
from .workspace import tools

OBSERVED_BATCH = 50
PIPELINE_LINGER_S = 0.005
"""How long pipelined read results wait for the results behind them before their record goes
out (a group commit's linger): a response of many reads makes a record of the reads of about
this long, not one of each read and the next. The group's last read, and anything after it,
does not wait for it: :meth:`Recorder.settle` sends at once."""
PIPELINE_MAX_EVENTS = 96
PIPELINE_MAX_CHARS = 256 * 1024
"""Waiting results go out without the linger once they are this many events or this much read
output (one Redis call stays small)."""
Op = tuple[str, str, str, str]
"""A small state write recorded with events: (op, key suffix, field, value); see ``cox_emit``."""
CLOSE_LEADS: Op = ("close_leads", "", "", "")
"""The op that closes Lead admission after the record's events, as ``cox_close_leads`` does
(the reply says ``closed``: :attr:`Recorder.leads_closed`)."""
TAKE_LEADS = "take_leads"


def take_leads_op(turn_id: str) -> Op:
    """The op that takes the Leads saved so far after the record's events (each marked applied and
    a ``user.msg``, then ``lead.applied`` for ``turn_id``; the reply's ``taken`` lists them): a
    safe boundary's skips and its Leads in one call (:meth:`Recorder.take_leads`)."""
    return (TAKE_LEADS, "", "", turn_id)


class Recorder:
    def __init__(self, deps: Deps, turn: Turn) -> None:
        self.deps = deps
        self.turn = turn
        self.history = transcript.Builder()
        self.open: dict[str, ToolCallPart] = {}
        """Calls of the latest response without a result yet; closed on every way out of the turn."""
        self.pending_user: list[tuple[str, str]] = []
        """User messages recorded but not yet in a model request: (text, via). A newer instruction:
        the calls of the response not started yet are skipped for it."""
        self.notes: list[tuple[str, str]] = []
        """System notes recorded as user messages (a budget warning): sent with the next model
        request, without skipping any call."""
        self.last_output = ""
        self.last_ok = True
        self.leads_hint = 0
        self.observed_hint = 0
        """What the last ``emit`` saw waiting: Leads and operator observations."""
        self.leads_closed = False
        """Lead admission was closed with the turn's final response (the ``close_leads`` op of its
        record: :attr:`cox_runner.step.ModelStep.may_close`), so the turn needs no call of its own for it."""
        self.emitted = False
        """This turn has recorded through :meth:`emit`: the hints above are Redis's, not unknown."""
        self._deferred: list[ev._Event] = []
        """Events recorded with the next ``emit`` (one Redis call instead of two)."""
        self._deferred_ops: list[Op] = []
        """State writes recorded with the next ``emit``, before its own."""
        self.takes_leads: Callable[[str], bool] | None = None
        """Set by the tool round for its last call: the boundary after it is the result's own
        record's when this says, given the result's output, that the turn goes on after it (the
        record's ``take_leads`` op takes the Leads saved meanwhile: :meth:`result`). Spent by the
        next result."""
        self.pipelined: str | None = None
        """The call whose result may be recorded behind the turn's back (:meth:`result`): a read
        followed by another read, set by the tool round for the call it is about to run."""
        self._ready: list[ev._Event] = []
        self._ready_ops: list[Op] = []
        self._ready_chars = 0
        """Pipelined results not yet sent: the next record of :meth:`_flush` (and their output's size)."""
        self._wake = asyncio.Event()
        """Cuts the linger short: set when the waiting results are enough for a record."""
        self._hurry = False
        """:meth:`settle` waits: no linger until it has returned."""
        self._flushing: asyncio.Future[None] | None = None
        """The pipelined records on their way (one Redis call at a time, in order)."""
        self._sending = False
        """:meth:`_flush` has a record on its way (not only lingering)."""
        self.today: spending.Today | None = None
        """What the session and its principal spent today, as the last recorded cost left it
        (None until the turn's first check: :meth:`cox_runner.checkpoints.Checkpoints.daily`)."""

    def e(self) -> dict[str, Any]:
        """The fields every event of this turn carries."""
        return {"sid": self.turn.sid, "turn_id": self.turn.turn_id}

    async def emit(self, *events: ev._Event, ops: list[Op] | None = None) -> Emitted:
        """Record events (and small state writes) fenced by this turn's token, after any deferred
        (and after every pipelined result: :meth:`settle` first). Returns ``cox_emit``'s reply."""
        if self._flushing is not None:
            await self.settle()
        return await self._record(*self._with_deferred(list(events), ops or []))

    async def take_leads(self, *events: ev._Event, ops: list[Op] | None = None) -> None:
        """Record ``events`` and ``ops`` (after whatever was deferred: a boundary's skips, the
        response recorded with them), then take the Leads saved so far in the same call (each
        marked applied and recorded as a user message, then ``lead.applied``): the Leads are in
        the log with the boundary. They join :attr:`pending_user`, oldest first, and the drive
        remembers them (a doorbell for one of them that comes after is no Lead waiting)."""
        self.turn.leads_waiting = False
        self.leads_hint = 0
        res = await self.emit(*events, ops=[*(ops or []), take_leads_op(self.turn.turn_id)])
        taken = res.get("taken")
        for x in taken if isinstance(taken, list) else []:
            self.pending_user.append((str(x["text"]), "lead"))
            self.turn.leads_taken.append(str(x["lead_id"]))

    def _with_deferred(self, events: list[ev._Event], ops: list[Op]) -> tuple[list[ev._Event], list[Op]]:
        """What was deferred, then ``events`` and ``ops``; the deferred are taken."""
        batch, self._deferred = [*self._deferred, *events], []
        ops, self._deferred_ops = [*self._deferred_ops, *ops], []
        return batch, ops

    async def _record(self, batch: list[ev._Event], ops: list[Op]) -> Emitted:
        t = self.turn
        try:
            res = await self.deps.store.fns.emit(sid=t.sid, token=t.token, owner=self.deps.owner, ops=ops,
                                                 events=[ev.body(e) for e in batch])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        self.emitted = True
        self.history.seq = max(self.history.seq, int(res.get("last") or 0))
        self.leads_hint = int(res.get("leads") or 0)
        self.observed_hint = int(res.get("observed") or 0)
        if CLOSE_LEADS in ops:
            self.leads_closed = bool(res.get("closed"))
        if "spend_day" in res:
            await self._spent(int(res["spend_day"]), float(res.get("spend_today") or 0), spending.spend_of(ops))
        return res

    def _pipeline(self, events: list[ev._Event], ops: list[Op], chars: int = 0) -> None:
        """Record ``events`` (with what was deferred) without waiting: they go with the next Redis
        call of :meth:`_flush`, which sends, one call at a time and in order, whatever was
        pipelined while the call before it was on its way or lingered (a group commit:
        :data:`PIPELINE_LINGER_S`). Only a read's result and a response's text chunk
        (:meth:`linger`) are recorded so: they changed nothing, so if the record is refused (the
        lease passed on) or lost with this process, the log is one a takeover goes on from, as if
        the read had not run or the chunk not come. A record refused is raised here, at the next
        pipelined result, or by :meth:`settle`."""
        batch, ops = self._with_deferred(events, ops)
        self._ready += batch
        self._ready_ops += ops
        self._ready_chars += chars
        if self._full():
            self._wake.set()
        task = self._flushing
        if task is not None and task.done():
            task.result()  # LeaseLost: the turn stops at this call, not after the reads to come
            self._flushing = None
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())
            self._flushing.add_done_callback(_retrieved)

    def linger(self, *events: ev._Event) -> None:
        """Record events that change nothing and that nothing waits on (a streaming response's
        text chunk) without waiting, as a read's result is (:meth:`_pipeline`): they go out
        after the linger, or with the next record. The stream is read on meanwhile."""
        self._pipeline(list(events), [])

    def take_lingering(self) -> None:
        """What waits to be pipelined and is not on its way yet goes with the next record instead
        (deferred, ahead of anything deferred since): the chunk lingering when a stream ends
        goes with its response's record, one Redis call instead of two one after the other."""
        if not (self._ready or self._ready_ops):
            return
        self._deferred[:0] = self._ready
        self._deferred_ops[:0] = self._ready_ops
        self._ready, self._ready_ops, self._ready_chars = [], [], 0
        task = self._flushing
        if task is not None and not task.done() and not self._sending:
            # It only lingered (nothing of it on its way): no wait for it to wake and find nothing.
            task.cancel()
            self._flushing = None

    def _full(self) -> bool:
        return len(self._ready) >= PIPELINE_MAX_EVENTS or self._ready_chars >= PIPELINE_MAX_CHARS

    async def _flush(self) -> None:
        while self._ready or self._ready_ops:
            if not (self._hurry or self._full()):
                # Linger for the results behind these (the next reads run meanwhile).
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PIPELINE_LINGER_S):
                        await self._wake.wait()
            batch, ops = self._ready, self._ready_ops
            self._ready, self._ready_ops, self._ready_chars = [], [], 0
            self._sending = True
            try:
                await self._record(batch, ops)
            finally:
                self._sending = False

    async def settle(self) -> None:
        """Wait until every pipelined result is in the log (LeaseLost if a record was refused):
        what lingers goes out now. Shielded: a turn cancelled while it waits leaves the record to
        finish (it is fenced)."""
        task = self._flushing
        if task is None:
            return
        self._hurry = True
        self._wake.set()
        try:
            await asyncio.shield(task)  # raises what refused a record (and it stays: raised again)
        finally:
            self._hurry = False
        self._flushing = None

    async def _spent(self, day: int, session: float, cost: float) -> None:
        """A model request's cost was counted in the session's spend of ``day``: count it in its
        principal's too (its own key: another call), and keep both for the turn's checks."""
        principal = str(self.turn.info.get("principal") or "")
        usd = 0.0
        if principal:
            day, usd = await spending.principal_spend(self.deps.store.fns, principal, cost)
        self.today = spending.Today(day=day, session=session, principal=usd)

    def defer(self, *events: ev._Event, ops: list[Op] | None = None) -> None:
        """Record ``events`` (and ``ops``) together with the next ones: they are known now, but
        nothing waits on them being in the log before the next event is (a call's start and its
        policy decision; the last text chunk and the complete response; a response whose first
        call is a read, with that read's record)."""
        self._deferred.extend(events)
        if ops:
            self._deferred_ops.extend(ops)

    @property
    def has_deferred(self) -> bool:
        return bool(self._deferred or self._deferred_ops)

    @property
    def closing(self) -> bool:
        """The turn's final response waits, deferred, to be recorded with the turn's end (its
        record closes Lead admission: :meth:`cox_runner.step.ModelStep.may_carry`)."""
        return CLOSE_LEADS in self._deferred_ops

    def deferred(self) -> tuple[list[str], list[Op]]:
        """What was deferred, as event bodies and ops, for ``cox_turn_end`` to record first (kept
        until it did: :meth:`carried`)."""
        return [ev.body(e) for e in self._deferred], list(self._deferred_ops)

    def carried(self, last: int, closed: bool, leads: int) -> None:
        """``cox_turn_end`` recorded the deferred record (its last seq ``last``): Lead admission
        closed with it, or ``leads`` wait and the turn goes on."""
        self._deferred, self._deferred_ops = [], []
        self.emitted = True
        self.history.seq = max(self.history.seq, last)
        self.leads_closed = closed
        self.leads_hint = leads

    async def result(self, call: ToolCallPart, ok: bool, output: str, extra: list[ev._Event] | None = None,
                     first: bool = False, limit: str | None = None) -> None:
        """Record a call's result. Operator observations waiting in Redis are folded into it, and
        taken off the list in the same atomic call that records it (so a rebuild agrees)."""
        t = self.turn
        raw: list[str] = []
        # Whether observations wait: the call that started the turn said (one recorded while the
        # session was idle rang no turn's doorbell), then each record's reply and the doorbell
        # (cox_runner.drive.observed_at_start).
        if self.observed_hint or t.observed_waiting:
            t.observed_waiting = False
            raw = await self.deps.redis.lrange(keys.session(t.sid) + keys.OBSERVED, 0, OBSERVED_BATCH - 1)
        observed: list[dict[str, Any]] = []
        for item in raw or []:
            with contextlib.suppress(ValueError):
                o = json.loads(item)
                observed.append({"command": str(o.get("command", "")), "output": str(o.get("output", ""))})
        result = ev.ToolResult(**self.e(), call_id=call.tool_call_id, ok=ok, output=output,
                               observed=observed or None, limit=limit)
        evs = [*(extra or []), result] if first else [result, *(extra or [])]
        ops: list[Op] = [("hdel", keys.OPEN_CALLS, call.tool_call_id, "")]
        if call.tool_name in tools.WRITES:
            ops.append(("hdel", keys.WRITES, call.tool_call_id, ""))  # its staged write is settled
        if raw:
            ops.append(("ltrim", keys.OBSERVED, str(len(raw)), "-1"))
        takes, self.takes_leads = self.takes_leads, None
        if self.pipelined == call.tool_call_id:
            self.pipelined = None
            self._pipeline(evs, ops, len(output))
        elif takes is not None and takes(output):
            # The round's last call, and the turn goes on after it: its record is the boundary's,
            # and takes the Leads saved while the call ran (in the log with the result, not a
            # round trip and a publish after it).
            await self.take_leads(*evs, ops=ops)
        else:
            await self.emit(*evs, ops=ops)
        self.open.pop(call.tool_call_id, None)
        self.history.tool_return(call.tool_call_id, output + transcript.fold(observed), call.tool_name)
        self.last_output = output
        self.last_ok = ok

    async def skip(self, calls: list[ToolCallPart], reason: str, defer: bool = False) -> None:
        """Close calls that never started: each gets a ``tool.skipped`` (and a result in the
        transcript). ``defer``: recorded with the next record (a boundary's, which takes the Leads)."""
        if not calls:
            return
        evs = [ev.ToolSkipped(**self.e(), call_id=c.tool_call_id, reason=reason) for c in calls]
        ops: list[Op] = [("hdel", keys.OPEN_CALLS, c.tool_call_id, "") for c in calls]
        if defer:
            self.defer(*evs, ops=ops)
        else:
            await self.emit(*evs, ops=ops)
        for c in calls:
            self.open.pop(c.tool_call_id, None)
            self.history.tool_return(c.tool_call_id, transcript.skip_text(reason), c.tool_name)

    async def user_message(self, text: str, message_id: str, via: ev.Via, note: bool = False) -> None:
        """A user message joined to the turn (an approval's message; with ``note`` a system note):
        recorded now, sent with the next model request, right after the tool result it answers."""
        (self.notes if note else self.pending_user).append((text, via))
        await self.emit(ev.UserMsg(**self.e(), message_id=message_id, text=text, via=via))

    def take_pending(self) -> None:
        """Move the recorded user messages into the transcript (before a model request)."""
        for text, via in (*self.pending_user, *self.notes):
            self.history.user(text, via)
        self.pending_user.clear()
        self.notes.clear()


def _retrieved(task: asyncio.Future[None]) -> None:
    """A pipelined record's failure is raised to the turn by :meth:`Recorder.settle` or the next
    pipelined result; a turn already gone (cancelled) has nobody to raise it to."""
    if not task.cancelled():
        task.exception()


def args_for_log(call: ToolCallPart) -> Any:
    """A call's arguments as the log records them: the parsed object, else the text as sent."""
    try:
        return call.args_as_dict(raise_if_invalid=True)
    except Exception:  # noqa: BLE001
        return call.args if isinstance(call.args, str) else str(call.args)
