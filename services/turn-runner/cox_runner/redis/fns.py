"""One typed method per function of the Redis library (``redis_lib.lua``).

Each method takes the function's ARGV as named arguments, in the order the Lua function reads
them, and returns its reply as a typed dict. The wire is the library's: every argument a string,
the session's key first among KEYS. A no-server test (tests/fast/test_fns.py) parses the Lua and
checks that every registered function has exactly one method here; that each sends the
function's fixed arguments under the names and in the order the function reads them into its
locals (a variable tail on both sides or neither); that it passes as many KEYS as the function
reads; and that the keys of every reply the function builds are its typed dict's, a key missing
from some reply ``NotRequired``.

Functions that record events go through :meth:`Store.call` (errors raised, outbox published, a
call whose connection broke retried with its transition id: the library answers a retry whose
first attempt ran with that attempt's reply); the lease keeper's ``cox_renew`` and the per-bucket
scans ``cox_claim`` and ``cox_dirty`` are queued on a pipeline (one per pass over every bucket);
the publishing functions (``cox_pub_done``, ``cox_pub_claim``) answer raw values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, Protocol, TypedDict, TypeVar, cast

from coxswain import keys

F = TypeVar("F", bound=Callable[..., Any])
StateOp = tuple[str, str, str, str]
"""A small state write recorded with events: (op, key suffix, field, value); see ``cox_emit``."""


def lua(name: str, reply: type | None = None) -> Callable[[F], F]:
    """Mark a method as the facade of the library function ``name``. ``reply``: the typed dict of
    the function's JSON head when the method does not return it (a pipelined call, whose caller
    reads the reply; a publishing call, which answers the batch); by default the method's return
    annotation. A function that answers a bare array (``cox_dirty``, ``cox_idle``) has neither."""

    def mark(fn: F) -> F:
        fn._lua = name  # type: ignore[attr-defined]
        fn._reply = reply  # type: ignore[attr-defined]
        return fn

    return mark


class Created(TypedDict):
    sid: str
    created: int


class Patched(TypedDict):
    ok: bool
    runner: str | None


class Sent(TypedDict):
    message_id: str
    disposition: str
    turn_id: NotRequired[str]
    token: NotRequired[str]
    """The lease's fencing token (a decimal string, as :data:`coxswain.keys.LEASE` holds it)."""
    position: NotRequired[int]
    runner: NotRequired[str | None]
    """The runner the session's turn runs on: the one it started on (``started``: the admitting
    runner, or the one running the session's programs), or the one running the turn it was
    queued or steered behind. None on a replay."""
    replay: NotRequired[bool]
    info: NotRequired[dict[str, str]]
    """When it started a turn: the session hash as that turn began (the turn reads nothing more)."""
    fresh: NotRequired[bool]
    """True when the turn it started is the session's first (``blank`` in :data:`coxswain.keys.SESSION_FIELDS`):
    the log holds nothing of a conversation before its message."""
    observed: NotRequired[int]
    """When it started a turn: the operator's observations waiting as it began (the turn's first
    result reads them only when some wait, or a doorbell says more came)."""
    resumed: NotRequired[dict[str, Any] | None]
    """A pause of an earlier day lifted by this send: the waiting message it started
    (``{next, token, turn_id, runner}``); this one was queued behind the others."""


class LeadSaved(TypedDict):
    lead_id: str
    pending: int
    turn_id: str
    runner: NotRequired[str | None]
    replay: NotRequired[bool]


class Stopped(TypedDict):
    turn_id: str | None
    discarded: Any
    unapplied_leads: Any
    stopped: bool
    runner: NotRequired[str | None]


class Answered(TypedDict):
    ok: bool
    runner: str | None
    turn_id: str


class Renewed(TypedDict):
    """What waits for the holder of the turn (read by the lease keeper, cox_runner.drive)."""
    stop: str
    leads: int
    lead_last: str
    """The newest Lead waiting ('' for none)."""
    observed: int
    dont_ask: bool
    turn_id: str
    """The turn these flags are for (the session's as the renewal ran; '' between turns)."""


class Emitted(TypedDict):
    first: int
    last: int
    leads: int
    observed: int
    spend_day: NotRequired[int]
    """With a ``spend`` op: the UTC day (Redis clock) the session's spend was counted on."""
    spend_today: NotRequired[float]
    """With a ``spend`` op: the session's spend on that day, this request's included."""
    closed: bool
    """With the ``close_leads`` op (:data:`cox_runner.recorder.CLOSE_LEADS`): Lead admission closed
    (as ``cox_close_leads`` closes it); false without the op."""
    taken: NotRequired[list[dict[str, str]]]
    """With the ``take_leads`` op (:func:`cox_runner.recorder.take_leads_op`), when Leads waited: the
    Leads it took (each marked applied and recorded as a ``user.msg``, then one ``lead.applied``),
    oldest first; absent when none waited."""


class FenceOk(TypedDict):
    ok: bool


class Titled(TypedDict):
    applied: bool


class LeadsClosed(TypedDict):
    closed: bool
    pending: int


class TurnEnded(TypedDict):
    next: dict[str, Any] | None
    turn_id: NotRequired[str]
    ended: str
    handed_off: NotRequired[bool]
    held: NotRequired[bool]
    info: NotRequired[dict[str, str]]
    """With ``next``: the session hash as the next turn began."""
    fresh: NotRequired[bool]
    """With ``next``: that turn is the session's first (a message that waited behind a person's operation)."""
    observed: NotRequired[int]
    """With ``next``: the operator's observations waiting as the next turn began."""
    paused: NotRequired[bool]
    """A daily budget pauses the session: nothing started, its messages wait."""
    last: int
    """The seq of the last carried event (0: none carried)."""
    goes_on: NotRequired[bool]
    """The carried ops closed Lead admission but a Lead waits: the turn did not end (``next`` is
    null, ``ended`` ''); its holder applies the Leads and goes on."""
    leads: NotRequired[int]
    """With ``goes_on``: the Leads waiting."""


class BudgetResumed(TypedDict):
    resumed: bool
    paused: bool
    budget: NotRequired[str]
    """Still paused: the budget that is still reached (``session_spend`` or ``principal_spend``)."""
    next: NotRequired[dict[str, Any]]
    """Resumed while idle: the waiting message that started (its turn is ``turn_id``)."""
    token: NotRequired[str]
    turn_id: NotRequired[str]
    runner: NotRequired[str]
    fresh: NotRequired[bool]
    """With ``next``: that turn is the session's first."""


class Spent(TypedDict):
    day: int
    """The UTC day (days since the epoch, Redis clock)."""
    usd: float


class OpBegun(TypedDict):
    token: str
    """The short lease's fencing token (a decimal string)."""


class ClaimedSession(TypedDict):
    """One entry of ``cox_claim``'s head, a JSON array of the sessions this runner took over."""
    sid: str
    token: str
    turn_id: str
    old_runner: str
    open: list[str]
    """The dead turn's open calls, flat: [call_id, name, ...]."""
    op: str


class PubDone(TypedDict):
    more: bool
    """True when the outbox holds more (its next batch follows the head, the lock renewed)."""


class PubClaimed(TypedDict):
    claimed: bool


class QueueRemoved(TypedDict):
    message_id: str
    removed: bool
    queue: Any


class QueueOrdered(TypedDict):
    queue: Any
    changed: bool


class RunStarted(TypedDict):
    sid: str
    created: int
    token: str
    """The first turn's lease token (a decimal string)."""
    turn_id: str
    info: dict[str, str]
    """The session hash as its first turn began (the turn reads nothing more)."""


class RunSlots(TypedDict):
    granted: Any
    """The members (``runner|sid|token``) that hold a slot now among those asked for (``?``)."""
    active: int
    """Slots held in the whole stack after this call."""


class WsClaimed(TypedDict):
    owner: str
    created: bool


class WsReleased(TypedDict):
    released: bool


class ArchiveTaken(TypedDict):
    seq: int
    sha: str
    snapshot: str
    principal: str


class ArchiveDropped(TypedDict):
    dropped: bool
    reason: NotRequired[str]


class ArchiveLoaded(TypedDict):
    restored: bool


class Caller(Protocol):
    """What the facade calls through: :class:`cox_runner.redis.store.Store`."""

    redis: Any

    async def fcall_raw(self, fn: str, ks: list[str], argv: list[str]) -> Any: ...

    async def call(self, fn: str, sid: str | None, args: list[Any], extra_keys: list[str] | None = None,
                   publish: bool = True, tx: str = "") -> dict[str, Any]: ...


class Fns:
    """The library's functions, called through ``store`` (one per runner process)."""

    def __init__(self, store: Caller) -> None:
        self.store = store

    async def _raw(self, fn: str, ks: list[str], argv: list[str]) -> Any:
        return await self.store.fcall_raw(fn, ks, argv)

    # ------------------------------------------------------------------ session lifecycle
    @lua("cox_create")
    async def create(self, *, sid: str, principal: str, workspace: str, model: str, title: str, body: str,
                     owner: str) -> Created:
        """The principal's index entry is written first, in its own call (another cluster slot): a
        crash between the two leaves an entry without a session, which a listing skips; the other
        order could leave a session nobody lists."""
        await self.store.redis.zadd(keys.principal(principal), {sid: int(time.time() * 1000)}, nx=True)
        res = await self.store.call("cox_create", sid, [sid, principal, workspace, model, title, body, owner])
        return cast(Created, res)

    @lua("cox_patch")
    async def patch(self, *, sid: str, principal: str, owner: str, fields: Sequence[tuple[str, str]]) -> Patched:
        """``fields``: (name, value) among title, auto_title, model, dont_ask."""
        res = await self.store.call("cox_patch", sid, [sid, principal, owner, *(x for f in fields for x in f)])
        return cast(Patched, res)

    # ------------------------------------------------------------------ admission
    @lua("cox_send")
    async def send(self, *, sid: str, principal: str, message_id: str, text: str, mode: str, client_id: str,
                   runner: str, lease_ms: int, turn_id: str, owner: str, models: str, agents_md: str,
                   attachments: str = "", traceparent: str = "", over: str = "", tx: str = "") -> Sent:
        """``mode``: '' (send), queue or steer; ``models``: the configured names, space separated;
        ``attachments``: a JSON array of the message's attachment records ('' for none);
        ``traceparent``: the W3C trace context the message's turn is a child of ('' for none);
        ``over``: why the principal's daily budget refuses it ('' = it does not)."""
        res = await self.store.call("cox_send", sid, [sid, principal, message_id, text, mode, client_id, runner,
                                                      str(lease_ms), turn_id, owner, models, agents_md, attachments,
                                                      traceparent, over], tx=tx)
        return cast(Sent, res)

    @lua("cox_lead")
    async def lead(self, *, sid: str, principal: str, lead_id: str, text: str, client_id: str, max_pending: int,
                   owner: str, want_turn: str, over: str = "", tx: str = "") -> LeadSaved:
        res = await self.store.call("cox_lead", sid, [sid, principal, lead_id, text, client_id, str(max_pending),
                                                      owner, want_turn, over], tx=tx)
        return cast(LeadSaved, res)

    @lua("cox_stop")
    async def stop(self, *, sid: str, principal: str, owner: str, tx: str = "") -> Stopped:
        return cast(Stopped, await self.store.call("cox_stop", sid, [sid, principal, owner], tx=tx))

    @lua("cox_answer")
    async def answer(self, *, sid: str, principal: str, aid: str, decision: str, scope: str, message: str,
                     owner: str, actor: str, why: str, tx: str = "") -> Answered:
        """``principal`` '' and an ``actor`` when the runner answers (dont_ask, policy); '' = a person."""
        res = await self.store.call("cox_answer", sid, [sid, principal, aid, decision, scope, message, owner,
                                                        actor, why], tx=tx)
        return cast(Answered, res)

    # ------------------------------------------------------------------ the turn's holder
    @lua("cox_renew", reply=Renewed)
    def renew(self, pipe: Any, *, sid: str, token: str, lease_ms: int) -> None:
        """Queue a renewal on the lease keeper's pipeline (its reply is read by the caller)."""
        pipe.fcall("cox_renew", 1, keys.session(sid), sid, token, str(lease_ms))

    @lua("cox_emit")
    async def emit(self, *, sid: str, token: str, owner: str, ops: Sequence[StateOp],
                   events: Sequence[str]) -> Emitted:
        """Record ``events`` and the state writes ``ops``; ``token`` '' records without a lease."""
        argv = [sid, token, owner, str(len(ops)), *(x for op in ops for x in op), *events]
        return cast(Emitted, await self.store.call("cox_emit", sid, argv))

    @lua("cox_fence")
    async def fence(self, *, sid: str, token: str, call_id: str, intent: str) -> FenceOk:
        return cast(FenceOk, await self.store.call("cox_fence", sid, [sid, token, call_id, intent]))

    @lua("cox_auto_title")
    async def auto_title(self, *, sid: str, token: str, owner: str, title: str, turn_id: str) -> Titled:
        return cast(Titled, await self.store.call("cox_auto_title", sid, [sid, token, owner, title, turn_id]))

    @lua("cox_close_leads")
    async def close_leads(self, *, sid: str, token: str) -> LeadsClosed:
        return cast(LeadsClosed, await self.store.call("cox_close_leads", sid, [sid, token]))

    @lua("cox_turn_end")
    async def turn_end(self, *, sid: str, token: str, owner: str, end_body: str, next_turn_id: str, lease_ms: int,
                       plan: str, handoff: str, hold_next: str, agents_md: str, pause: str = "",
                       ops: Sequence[StateOp] = (), events: Sequence[str] = ()) -> TurnEnded:
        """``plan``: '' keep, '-' clear, else JSON; ``handoff``/``hold_next``: '1' or ''; ``pause``:
        '' or the JSON of the daily budget the turn reached (the session pauses); ``ops`` and
        ``events``: the turn's final record, carried (as :meth:`emit`'s, no ``spend`` op), recorded
        first; with a ``close_leads`` op and a Lead waiting the turn does not end (``goes_on``)."""
        res = await self.store.call("cox_turn_end", sid, [sid, token, owner, end_body, next_turn_id, str(lease_ms),
                                                          plan, handoff, hold_next, agents_md, pause, str(len(ops)),
                                                          *(x for op in ops for x in op), *events])
        return cast(TurnEnded, res)

    @lua("cox_budget_resume")
    async def budget_resume(self, *, sid: str, owner: str, session_spend: str, principal_usd: str,
                            principal_spend: str, runner: str, lease_ms: int, turn_id: str, agents_md: str,
                            by: str) -> BudgetResumed:
        """Lift a daily budget's pause if today's budgets are now above what was spent (and, idle,
        start the first waiting message); ``by``: ``patch`` or ``reload``. Numbers as text, '' = none."""
        res = await self.store.call("cox_budget_resume", sid, [sid, owner, session_spend, principal_usd,
                                                               principal_spend, runner, str(lease_ms), turn_id,
                                                               agents_md, by])
        return cast(BudgetResumed, res)

    @lua("cox_spend")
    async def spend(self, *, principal: str, add: str) -> Spent:
        """Add ``add`` USD (a number as text) to the principal's spend of the day ('0': read it);
        answers its spend today."""
        res = await self.store.call("cox_spend", None, [add], extra_keys=[keys.principal_spend(principal)])
        return cast(Spent, res)

    @lua("cox_op_begin")
    async def op_begin(self, *, sid: str, principal: str, runner: str, lease_ms: int, op: str) -> OpBegun:
        res = await self.store.call("cox_op_begin", sid, [sid, principal, runner, str(lease_ms), op])
        return cast(OpBegun, res)

    # ------------------------------------------------------------------ takeover, publishing
    @lua("cox_claim", reply=ClaimedSession)
    def claim(self, pipe: Any, *, buckets: list[int], runner: str, lease_ms: int, limit: int) -> None:
        """Queue a claim of ``buckets`` on ``pipe`` (one bucket in a cluster: one slot a call); its
        reply is ``[JSON]`` of the claimed sessions (:meth:`cox_runner.redis.store.Store.claim`)."""
        pipe.fcall("cox_claim", len(buckets), *(keys.leases(b) for b in buckets), runner, str(lease_ms), str(limit))

    @lua("cox_pub_done", reply=PubDone)
    async def pub_done(self, *, sid: str, owner: str, last: int, stream: int | None = None) -> list[str]:
        """The next batch of the outbox to publish (empty: done, the lock is freed). ``stream``:
        the stream seq of the message holding seq ``last`` (kept for the lock's next holder)."""
        res = await self._raw("cox_pub_done", [keys.session(sid)],
                              [sid, owner, str(last), "" if stream is None else str(stream)])
        return list(res[1:])

    @lua("cox_dirty")
    def dirty(self, pipe: Any, *, buckets: list[int], min_age_ms: int, limit: int) -> None:
        """Queue the sweeper's look at ``buckets`` on ``pipe``; its reply is a list of sids."""
        pipe.fcall("cox_dirty", len(buckets), *(keys.dirty(b) for b in buckets), str(min_age_ms), str(limit))

    @lua("cox_pub_claim", reply=PubClaimed)
    async def pub_claim(self, *, sid: str, owner: str) -> list[str]:
        """The first batch of the outbox when this process took its publish lock, else empty."""
        res = await self._raw("cox_pub_claim", [keys.session(sid)], [sid, owner])
        return list(res[1:])

    # ------------------------------------------------------------------ queue management
    @lua("cox_queue_remove")
    async def queue_remove(self, *, sid: str, principal: str, message_id: str, owner: str) -> QueueRemoved:
        res = await self.store.call("cox_queue_remove", sid, [sid, principal, message_id, owner])
        return cast(QueueRemoved, res)

    @lua("cox_queue_order")
    async def queue_order(self, *, sid: str, principal: str, owner: str, message_ids: Sequence[str]) -> QueueOrdered:
        res = await self.store.call("cox_queue_order", sid, [sid, principal, owner, *message_ids])
        return cast(QueueOrdered, res)

    # ------------------------------------------------------------------ idle sessions (cox_runner.redis.archive)
    @lua("cox_idle")
    def idle(self, pipe: Any, *, buckets: list[int], idle_ms: int, limit: int) -> None:
        """Queue the archiver's look at ``buckets`` on ``pipe``; its reply is a list of sids."""
        pipe.fcall("cox_idle", len(buckets), *(keys.active(b) for b in buckets), str(idle_ms), str(limit))

    @lua("cox_archive_take")
    async def archive_take(self, *, sid: str, idle_ms: int, owner: str, body: str,
                           suffixes: Sequence[str]) -> ArchiveTaken:
        """Record ``session.archived`` (``body``) and answer the snapshot after it; refused
        ``not_idle`` when the session is not idle or not archivable."""
        res = await self.store.call("cox_archive_take", sid, [sid, str(idle_ms), owner, body, *suffixes])
        return cast(ArchiveTaken, res)

    @lua("cox_archive_drop")
    async def archive_drop(self, *, sid: str, seq: int, sha: str, suffixes: Sequence[str]) -> ArchiveDropped:
        res = await self.store.call("cox_archive_drop", sid, [sid, str(seq), sha, *suffixes])
        return cast(ArchiveDropped, res)

    @lua("cox_archive_load")
    async def archive_load(self, *, sid: str, snapshot: str, seq: int, owner: str, body: str) -> ArchiveLoaded:
        """Load the keys back unless Redis holds the session (then ``restored`` is false)."""
        res = await self.store.call("cox_archive_load", sid, [sid, snapshot, str(seq), owner, body])
        return cast(ArchiveLoaded, res)
    # ------------------------------------------------------------------ fork
    @lua("cox_fork")
    async def fork(self, *, sid: str, principal: str, workspace: str, model: str, title: str, owner: str,
                   body: str, events: Sequence[str]) -> Created:
        """A new session as :meth:`create` makes one (the principal's index entry first), its log
        beginning with ``events`` (the copied transcript, then ``session.forked``), in one call."""
        await self.store.redis.zadd(keys.principal(principal), {sid: int(time.time() * 1000)}, nx=True)
        res = await self.store.call("cox_fork", sid, [sid, principal, workspace, model, title, owner, body, *events])
        return cast(Created, res)

    # ------------------------------------------------------------------ workspaces (cox_runner.workspaces)
    @lua("cox_ws_claim")
    async def ws_claim(self, *, name: str, owner: str) -> WsClaimed:
        """Record ``owner`` for workspace ``name`` unless it has one (answers its owner); refused
        ``workspace_nested`` inside or around a recorded workspace. Its keys are in slot ``{ws}``.
        Safe to run again: a retry finds its own record."""
        res = await self.store.call("cox_ws_claim", None, [name, owner],
                                    extra_keys=[keys.WS_OWNERS, keys.WS_NAMES, keys.ws_principal(owner)])
        return cast(WsClaimed, res)

    @lua("cox_ws_release")
    async def ws_release(self, *, name: str, owner: str) -> WsReleased:
        res = await self.store.call("cox_ws_release", None, [name, owner],
                                    extra_keys=[keys.WS_OWNERS, keys.WS_NAMES, keys.ws_principal(owner)])
        return cast(WsReleased, res)

    # ------------------------------------------------------------------ runs (cox_runner.admission, runslots)
    @lua("cox_run")
    async def run(self, *, sid: str, principal: str, workspace: str, model: str, title: str, body: str,
                  owner: str, message_id: str, text: str, runner: str, lease_ms: int, turn_id: str,
                  agents_md: str, run: str, start_body: str) -> RunStarted:
        """A run's session made, marked a run and its first turn begun, in one call (the
        principal's index entries first, as for :meth:`create`)."""
        now = int(time.time() * 1000)
        await self.store.redis.zadd(keys.principal(principal), {sid: now}, nx=True)
        await self.store.redis.zadd(keys.runs_of(principal), {sid: now}, nx=True)
        res = await self.store.call("cox_run", sid, [sid, principal, workspace, model, title, body, owner, message_id,
                                                     text, runner, str(lease_ms), turn_id, agents_md, run, start_body])
        return cast(RunStarted, res)

    @lua("cox_run_slots")
    async def run_slots(self, *, runner: str, max_active: int, lease_ms: int, entries: Sequence[str]) -> RunSlots:
        """Renew (``+member``), free (``-member``) and ask for (``?member``) run slots in one call."""
        res = await self.store.call("cox_run_slots", None, [runner, str(max_active), str(lease_ms), *entries],
                                    extra_keys=[keys.RUN_SLOTS, keys.RUN_POLLERS])
        return cast(RunSlots, res)
