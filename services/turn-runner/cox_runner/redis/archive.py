"""Idle sessions: archive their Redis keys to JetStream KV and drop them; load them back on use.

Archiving one session (any runner may; each looks at a share of the buckets a pass, like the
sweeper, so one runner alone finds every idle session):

1. ``cox_archive_take``: if the session recorded nothing for ``[sessions] idle_days`` and
   nothing runs, waits or is unpublished (no lease, empty queues, no pending Lead, no open
   approval, no staged write, empty outbox), record ``session.archived`` through the outbox and
   answer a snapshot of every key of :data:`coxswain.keys.ARCHIVED` after it, with its sha1.
2. Put the snapshot in the ``COX_ARCHIVE`` bucket (never over an entry of a later seq).
3. Publish the outbox (the ``session.archived`` event: the log's seq stays one sequence). If the
   put failed, the event is still published (by a sweeper): it says the state was taken, and
   the session simply stays in Redis.
4. ``cox_archive_drop``: drop the keys, only if the session is exactly as snapshotted (same seq,
   same sha1 of its keys) and still archivable. A send (or anything else) that came meanwhile
   changed it: nothing is dropped, and the archive's now stale entry is ignored while Redis has
   the session.

Loading back (:meth:`Archiver.reload`): a runner's transition that finds no session (``not_found``)
looks in the archive; ``cox_archive_load`` writes the keys back and records
``session.restored`` in one call, unless Redis has the session already (a concurrent reload was
first, or it was never dropped), and the transition runs again. The loader then deletes the
entry, only at the revision it loaded (a later archive's entry is never deleted), and only once
the load is confirmed (``[redis] wait_replicas``): a failover cannot lose both copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from coxswain import archive, eventlog, keys
from coxswain import events as ev
from coxswain.config import Settings
from coxswain.errors import CoxError, NotFound, logged

from .store import Store

SHARE = 4
"""In a cluster, a pass looks at this share of the buckets (every bucket within that many passes)."""
PASS_LIMIT = 50
"""At most this many sessions archived a pass (the rest wait for the next one)."""
PAUSE_ENV = "COX_FAULT_ARCHIVE_PAUSE_S"
"""Test-only (with ``COX_TEST_FAULTS=1``): seconds to wait between the archive's put and the
drop, so a test can use the session in that window."""
DAY_MS = 86_400_000

R = TypeVar("R")


def idle_ms(settings: Settings) -> int:
    """``[sessions] idle_days`` in ms; 0: never archive."""
    return int(settings.sessions.idle_days * DAY_MS)


def pause_from_env(environ: dict[str, str] | os._Environ[str], log: Any) -> float:
    raw = environ.get(PAUSE_ENV, "")
    if not raw:
        return 0.0
    if environ.get("COX_TEST_FAULTS") != "1":
        log.warning("fault.injection_ignored", detail=f"{PAUSE_ENV} is set but COX_TEST_FAULTS=1 is not: ignored")
        return 0.0
    log.error("fault.injection_on", archive_pause_s=float(raw),
              detail="test-only fault injection: the archiver waits between its put and its drop")
    return float(raw)


class Archiver:
    def __init__(self, settings: Settings, store: Store, js: JetStreamContext, log: Any, owner: str) -> None:
        self.settings = settings
        self.store = store
        self.js = js
        self.log = log
        self.owner = owner
        self.kv: KeyValue | None = None
        self._cursor = 0
        self.pause_s = pause_from_env(os.environ, log)

    async def start(self) -> None:
        """Make the bucket (reloads need it even when archiving is off now)."""
        # Like the events stream: JetStream may be electing its leaders while the cluster starts.
        self.kv = await eventlog.patiently(
            lambda: archive.bucket(self.js, create=True, replicas=self.settings.nats.stream_replicas))

    # ------------------------------------------------------------------ archiving
    async def run_pass(self) -> int:
        """Archive the idle sessions of this pass's share of the buckets; how many were dropped."""
        limit_ms = idle_ms(self.settings)
        if limit_ms <= 0:
            return 0
        n = keys.buckets()
        todo = None
        if self.store.cluster:
            count = -(-n // SHARE)
            todo = [(self._cursor + i) % n for i in range(min(count, n))]
            self._cursor = (self._cursor + count) % n
        replies = await self.store._scan(lambda pipe, g: self.store.fns.idle(pipe, buckets=g, idle_ms=limit_ms,
                                                                             limit=PASS_LIMIT), buckets=todo)
        dropped = 0
        for sid in (s for r in replies for s in r):
            try:
                dropped += await self.archive(str(sid), limit_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one session's failure leaves it in Redis, as it was
                self.log.warning("archive.failed", sid=sid, error=logged(exc))
        return dropped

    async def archive(self, sid: str, limit_ms: int) -> bool:
        """Archive one session if it is idle and archivable; True when its keys were dropped."""
        assert self.kv is not None
        body = ev.body(ev.SessionArchived(sid=sid, idle_ms=limit_ms))
        try:
            # No publish lock with it (owner ''): the event is published after the put, below
            # (or by a sweeper if this runner dies first).
            took = await self.store.fns.archive_take(sid=sid, idle_ms=limit_ms, owner="", body=body,
                                                     suffixes=keys.ARCHIVED)
        except CoxError as exc:
            if exc.code not in ("not_idle", "not_found"):
                raise
            return False
        seq, sha = int(took["seq"]), str(took["sha"])
        record = {"v": archive.VERSION, "sid": sid, "principal": took.get("principal"), "seq": seq, "sha": sha,
                  "archived": int(time.time() * 1000), "keys": json.loads(took["snapshot"])}
        if not await self._put(sid, record):
            return False
        if not await self.store.outbox.flush(sid, timeout=10.0):
            self.log.warning("archive.kept", sid=sid, seq=seq, reason="its events are not published yet")
            return False
        if self.pause_s:
            await asyncio.sleep(self.pause_s)
        res = await self.store.fns.archive_drop(sid=sid, seq=seq, sha=sha, suffixes=keys.ARCHIVED)
        if not res.get("dropped"):
            self.log.info("archive.kept", sid=sid, seq=seq, reason=res.get("reason"))
            return False
        self.log.info("session.archived", sid=sid, seq=seq)
        return True

    async def _put(self, sid: str, record: dict[str, Any]) -> bool:
        """Put ``record`` unless the bucket holds the same or a later seq (compare and set: a slow
        archiver's older snapshot never replaces a newer one whose keys may have been dropped)."""
        assert self.kv is not None
        value = archive.encode(record)
        for _ in range(5):
            cur = await archive.read(self.kv, sid)
            try:
                if cur is None:
                    await self.kv.create(sid, value)
                elif cur.seq >= record["seq"]:
                    return False
                else:
                    await self.kv.update(sid, value, last=cur.revision)
                return True
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another writer came in between: look again
        return False

    # ------------------------------------------------------------------ loading back
    async def reload(self, sid: str) -> bool:
        """Load an archived session back into Redis when it is not there; True when the session is
        in Redis now because of this call or a concurrent one (False: no such session)."""
        if self.kv is None:
            return False
        if await self.store.redis.exists(keys.session(sid)):
            return True  # loaded back by a concurrent request since the handler looked
        entry = await archive.read(self.kv, sid)
        if entry is None:  # no such session, or a concurrent load finished and deleted the entry
            return bool(await self.store.redis.exists(keys.session(sid)))
        body = ev.body(ev.SessionRestored(sid=sid, archived_seq=entry.seq))
        res = await self.store.fns.archive_load(sid=sid, snapshot=json.dumps(entry.record["keys"]), seq=entry.seq,
                                                owner=self.owner, body=body)
        if not res.get("restored"):
            return True  # a concurrent load was first: it deletes the entry once its load is replicated
        self.log.info("session.restored", sid=sid, archived_seq=entry.seq)
        # The load is in Redis (and, with [redis] wait_replicas, on a replica: cox_archive_load is
        # waited for), so the entry can go; only the revision just loaded: a later archive's stays.
        # An entry left behind (this delete failed) is ignored while Redis has the session.
        with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
            await self.kv.delete(sid, last=entry.revision)
        return True

    def reloading(self, handler: Callable[[Any], Awaitable[R]]) -> Callable[[Any], Awaitable[R]]:
        """``handler`` of a session's request, run again once after loading the session back when
        it answered ``not_found`` for an archived session (nothing ran the first time)."""

        async def run(cmd: Any) -> R:
            try:
                return await handler(cmd)
            except NotFound:
                sid = getattr(cmd, "sid", None)
                if not sid or not await self.reload(str(sid)):
                    raise
            return await handler(cmd)

        run.__name__ = getattr(handler, "__name__", "handler")
        return run
