"""Publishing a session's outbox to JetStream, in order (docs/design.md, "The event log").

A Redis call that recorded events may hand back a batch of the session's outbox together with its
publish lock; :meth:`Outbox.start` then publishes the batch in a kept background task and asks
for the next one until the outbox is empty, so an HTTP reply or the turn loop does not wait on
JetStream. With ``wait_replicas`` a batch leaves only once the replicas hold it.

A call of this process that records events while its publisher of the session is busy is handed
what follows that publisher's batches (:meth:`Outbox.go_on`): the publisher takes it next, with no
``cox_pub_done`` between (it trims once its work runs out, or every :data:`TRIM_EVERY` entries).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from typing import Any

import redis.exceptions
from nats.js import JetStreamContext

from coxswain import eventlog, keys
from coxswain.errors import logged

from .fns import Fns
from .replicas import Replicas

PUB_LOCK_MS = 5000
"""The publish lock's lifetime (``PUB_LOCK_MS`` in the library)."""
CONTINUED = "~"
"""The first entry of a batch that continues this process's publisher's (``CONTINUED`` in the library)."""
POSITION = "@"
"""The first entry of a fresh lock's batch: ``@<event seq>:<stream seq>``, where the session's
subject ended when the lock was last freed (``POSITION`` in the library): a hint, so the
publisher needs no look at the stream when another process published last."""
TRIM_EVERY = 100
"""Entries a publisher publishes from batches handed on (:meth:`Outbox.go_on`) before it trims
the outbox (``cox_pub_done``, which also renews the lock) though more keeps coming."""
TRIM_EVERY_S = 1.0
"""The same bound in time: the lock (``PUB_LOCK_MS``) is renewed well before it lapses."""
MARKS_KEPT = 8
"""Messages of a session whose place in the stream this process remembers (:meth:`Outbox.holding`)."""
RECENT_BYTES = 16 * 1024
"""Of the entries its calls recorded lately, what this process keeps per session (the newest) for
a turn that starts from a kept transcript (:meth:`Outbox.recorded`)."""
RECENT_ENTRY_MAX = 8 * 1024
"""An entry larger than this is not kept (nor one the stream would take in another form)."""
RECENT_SESSIONS = 256
"""Sessions whose recent entries are kept by default, the least recently recording dropped first
(:attr:`Outbox.recent_sessions`: the runner's ``[runner] transcripts_kept``, whose default this is)."""


class _Recent:
    """A session's newest recorded entries by seq, at most :data:`RECENT_BYTES` of them."""

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: dict[int, str] = {}
        self.size = 0

    def add(self, seq: int, entry: str) -> None:
        if seq in self.entries:
            return
        self.entries[seq] = entry
        self.size += len(entry)
        while self.size > RECENT_BYTES and self.entries:
            # The first one kept goes first (replies are read in about seq order; one read later
            # than its successor only goes a little early, and the tail is then read instead).
            self.size -= len(self.entries.pop(next(iter(self.entries))))


class Outbox:
    def __init__(self, redis: Any, js: JetStreamContext, fns: Fns, owner: str, log: Any, replicas: Replicas) -> None:
        self.redis = redis
        self.js = js
        self.fns = fns
        self.owner = owner
        self.log = log
        self.replicas = replicas
        self._publishers: dict[str, asyncio.Task[None]] = {}
        self._next: dict[str, dict[int, str]] = {}
        """Entries handed to a running publisher (:meth:`go_on`, :meth:`start`) by seq: replies
        read on several connections come in any order, the publisher takes them in seq order."""
        self._fresh: dict[str, list[str]] = {}
        """The first batch of the next tenure of the lock, for a publisher still finishing the last."""
        self._cursors: eventlog.Cursors = {}
        self._recent: collections.OrderedDict[str, _Recent] = collections.OrderedDict()
        self.recent_sessions = RECENT_SESSIONS
        """Sessions whose recent entries are kept: only a session with a kept transcript uses them
        (:class:`~cox_runner.logreader.LogReader` sets it to how many it keeps; 0: none)."""
        self._marks: dict[str, collections.deque[tuple[int, int, int]]] = {}
        """The last :data:`MARKS_KEPT` messages this process published of a session: (first event
        seq, last event seq, stream seq)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        """Flushes through a seq (:meth:`flush`) waiting on this process's publisher of the session."""
        self.handed_on = 0
        """Batches a running publisher took without a ``cox_pub_done`` between (for tests)."""

    def start(self, sid: str, batch: list[str]) -> None:
        """Publish ``batch``, the first of the outbox: Redis handed this process the session's
        publish lock with it, so no other publisher of the session runs anywhere until this
        process has drained the outbox. One of this process's may still be finishing (its
        ``cox_pub_done`` freed the lock, then another call here took it): it goes on with this."""
        self._remember(sid, batch)
        if sid in self._publishers:
            self._fresh[sid] = batch
            return
        task = asyncio.create_task(self.publish(sid, batch), name=f"publish:{sid}")
        self._tasks.add(task)
        self._publishers[sid] = task
        task.add_done_callback(self._tasks.discard)

    def go_on(self, sid: str, batch: list[str]) -> None:
        """``batch`` follows what this process's publisher of the session was handed: it publishes
        it next. With none running (it failed, its lock not yet lapsed) it is left in the outbox:
        the sweeper publishes it once the lock lapses, after the events before it."""
        self._remember(sid, batch)
        if sid in self._publishers:
            self._hand(sid, batch)

    def _hand(self, sid: str, batch: list[str]) -> None:
        waiting = self._next.setdefault(sid, {})
        for entry in batch:
            waiting[eventlog.seq_of(entry)] = entry

    def _take(self, sid: str, last: int) -> list[str]:
        """The entries handed on that follow seq ``last`` without a gap, in order (those at or
        before it dropped). One beyond a gap stays: the reply holding what comes before it may
        not have been read yet (or ``cox_pub_done``, from the outbox's head, hands them all)."""
        waiting = self._next.get(sid)
        if not waiting:
            return []
        out: list[str] = []
        for seq in sorted(waiting):
            if seq <= last:
                del waiting[seq]
            elif seq == last + 1 + len(out):
                out.append(waiting.pop(seq))
            else:
                break
        return out

    async def _replicated(self, sid: str) -> bool:
        """With ``wait_replicas``: True once that many replicas hold everything the session's
        master has written so far (the batch about to be published included).

        ``WAIT`` counts the replicas that reached this connection's last write, and the
        replication stream is one ordered stream per master: so a write here (the publish lock's
        expiry pushed on; we hold the lock) followed by ``WAIT`` covers every earlier write of that
        master, whichever connection made it. Without this an event could reach the stream,
        then be lost with its master before a replica had it: the promoted replica would hand
        its seq to a new event, which the stream would drop as a duplicate."""
        if not self.replicas.wait_replicas:
            return True
        key = keys.of(sid, keys.PUBLOCK)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.pexpire(key, PUB_LOCK_MS)
            self.replicas.queue_wait(pipe, key)
            held, acked = await pipe.execute(raise_on_error=False)
        if isinstance(held, Exception) or isinstance(acked, Exception) or not held:
            return False  # the lock is gone (another publisher) or the master is: nothing to publish here
        return int(acked) >= self.replicas.wait_replicas

    async def publish(self, sid: str, batch: list[str]) -> None:
        """Publish ``batch`` and what follows it until the outbox is empty. Run by :meth:`start`
        (the session's publisher here, registered until it returns) or by a caller that holds the
        lock it claimed (the sweeper, a flush), which waits for it."""
        me = asyncio.current_task()
        mine = self._publishers.get(sid) is me
        loop = asyncio.get_running_loop()
        try:
            if mine:
                # Started by a call that recorded these events, maybe a request's handler: a reply
                # it queues on the NATS connection before its next wait is written first. Before,
                # the gateway read the events in the same packet as the reply and rendered them
                # for the session's streams before the route resumed (a send's 202 0.3-0.5 ms
                # later on a 2-core VM).
                await asyncio.sleep(0)
            since, trimmed = 0, loop.time()
            while batch:
                if batch[0][:1] == POSITION:
                    self._position(sid, batch[0])
                    batch = batch[1:]
                    continue
                if not await self._replicated(sid):
                    # Not on a replica yet: publish nothing. The lock lapses and the sweeper
                    # tries again (the events stay in the outbox, in order).
                    self.log.warning("outbox.not_replicated", sid=sid, wait_ms=self.replicas.wait_ms)
                    return
                # Entries already in the stream (a batch handed on overlaps the one cox_pub_done
                # handed) are skipped by their seq.
                last = await eventlog.publish(self.js, sid, batch, cursors=self._cursors,
                                              sent=lambda first, end, at: self._mark(sid, first, end, at))
                self._published(sid, last)
                since += len(batch)
                if mine and since < TRIM_EVERY and loop.time() - trimmed < TRIM_EVERY_S:
                    batch = self._take(sid, last)
                    if batch:
                        self.handed_on += 1
                        continue
                # Trim, and the outbox from its head (what was handed on and is not published yet
                # included: taken next, skipped by seq where it was).
                pos = self._cursors.get(sid)
                batch = await self.fns.pub_done(sid=sid, owner=self.owner, last=last,
                                                stream=pos[1] if pos is not None and pos[0] == last else None)
                since, trimmed = 0, loop.time()
                if not batch and mine:
                    # The lock was freed; a call here may have taken it again since (start): go
                    # on with what it was handed (what was handed on before is published, or
                    # follows that batch: taken after it).
                    batch = self._fresh.pop(sid, [])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the lock expires and the sweeper republishes
            self.log.warning("outbox.publish_failed", sid=sid, error=logged(exc))
        finally:
            if mine and self._publishers.get(sid) is me:
                # No await from the last look at _next to here: whatever start or go_on added
                # was taken; from now on they see no publisher of the session here.
                del self._publishers[sid]
                self._next.pop(sid, None)
                self._fresh.pop(sid, None)
                self._published(sid, None)  # a flush waiting on it looks again

    def _position(self, sid: str, entry: str) -> None:
        """Take a fresh lock's position hint (:data:`POSITION`) unless this process knows a later one."""
        try:
            last, stream = (int(x) for x in entry[1:].split(":", 1))
        except ValueError:
            self.log.warning("outbox.bad_position", sid=sid, entry=entry[:40])
            return
        mine = self._cursors.get(sid)
        if mine is None or mine[0] < last:
            self._cursors[sid] = (last, stream)

    def position(self, sid: str) -> int | None:
        """The stream seq of the session's last message this process published (None: none known
        here). Later events of the session are in later messages of its subject."""
        pos = self._cursors.get(sid)
        return pos[1] if pos is not None else None

    def _remember(self, sid: str, batch: list[str]) -> None:
        if self.recent_sessions <= 0:
            return
        recent = self._recent.pop(sid, None) or _Recent()
        self._recent[sid] = recent
        for entry in batch:
            if len(entry) <= RECENT_ENTRY_MAX and (seq := eventlog.seq_of(entry)):
                recent.add(seq, entry)
        while len(self._recent) > self.recent_sessions:
            self._recent.popitem(last=False)

    def recorded(self, sid: str, after: int, until: int) -> list[dict[str, Any]] | None:
        """The session's events ``after < seq <= until`` from the entries this process's calls
        recorded lately (:meth:`start`, :meth:`go_on`), whether published yet or not; None unless
        every one of them is at hand. They are the log's own (recorded in Redis, published in this
        order), so a transcript folds them as it would the stream's."""
        recent = self._recent.get(sid)
        if until <= after:
            return []
        if recent is None:
            return None
        out = []
        for seq in range(after + 1, until + 1):
            entry = recent.entries.get(seq)
            if entry is None:
                return None
            out.append(json.loads(entry))
        return out

    def _mark(self, sid: str, first: int, last: int, stream: int) -> None:
        marks = self._marks.get(sid)
        if marks is None:
            if len(self._marks) >= eventlog.CURSORS_MAX:
                self._marks.clear()
            marks = self._marks[sid] = collections.deque(maxlen=MARKS_KEPT)
        marks.append((first, last, stream))

    def holding(self, sid: str, seq: int) -> int | None:
        """The stream seq of the message holding the session's event ``seq``, when this process
        published it lately (None: not known here). A hint: the stream may have changed since."""
        for first, last, stream in reversed(self._marks.get(sid, ())):
            if first <= seq <= last:
                return stream
        return None

    def _published(self, sid: str, last: int | None) -> None:
        """Wake the flushes through ``last`` or before (``None``: every flush of the session, to look again)."""
        waiting = self._waiting.get(sid)
        if not waiting:
            return
        keep = []
        for through, fut in waiting:
            if last is not None and through > last:
                keep.append((through, fut))
            elif not fut.done():
                fut.set_result(None)
        if keep:
            self._waiting[sid] = keep
        else:
            del self._waiting[sid]

    def _published_through(self, sid: str, through: int | None) -> bool:
        pos = self._cursors.get(sid)
        return through is not None and pos is not None and pos[0] >= through

    async def flush(self, sid: str, timeout: float = 5.0, through: int | None = None) -> bool:
        """Wait until the session's outbox is published (so the log can be read in full), or with
        ``through``, until its events up to that seq are: what was recorded after them (the sends
        queued behind a turn that starts) does not hold the caller, who reads the log only that far."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        base = keys.session(sid)
        while loop.time() < deadline:
            if self._published_through(sid, through):
                return True
            mine = self._publishers.get(sid)
            if mine is not None:
                # This process publishes the session's outbox: wait for it (or for its publish of
                # the seq asked for), do not poll.
                waits: set[asyncio.Future[Any]] = {mine}
                if through is not None:
                    fut = loop.create_future()
                    self._waiting.setdefault(sid, []).append((through, fut))
                    waits.add(fut)
                try:
                    await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if through is not None:
                        self._forget(sid, fut)
                continue
            if await self.redis.llen(base + keys.OUTBOX) == 0:
                return True
            with contextlib.suppress(redis.exceptions.ResponseError):
                batch = await self.fns.pub_claim(sid=sid, owner=self.owner)
                if batch:
                    await self.publish(sid, batch)
                    continue
            await asyncio.sleep(0.002)  # another process holds the lock and is publishing
        return False

    def _forget(self, sid: str, fut: asyncio.Future[None]) -> None:
        waiting = self._waiting.get(sid)
        if waiting is None:
            return
        waiting[:] = [w for w in waiting if w[1] is not fut]
        if not waiting:
            del self._waiting[sid]

    async def close(self) -> None:
        """Let publishing in flight finish (bounded), then cancel the rest."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=3)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
