"""Reading a session's whole log: the outbox flushed, then JetStream read up to the last event.

A turn whose session was idle before it starts from the transcript the last drive here left
(:meth:`LogReader.keep`, a bounded number of sessions, ``[runner] transcripts_kept``) and folds in
only the events recorded since, read by direct gets from where the session's messages were: its
cost no longer grows with the session's length. Anything the fold cannot take the way
:func:`transcript.build` would (a conversation rewind, an attachment withheld, another model's
view of images, a gap in the tail) rebuilds from the whole log as before.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.exceptions
from nats.js import JetStreamContext

from coxswain import eventlog, keys
from coxswain.errors import logged

from .errors import StopRequested
from .leases import Leases
from .redis.store import Store

if TYPE_CHECKING:
    # Imported where a transcript is built, in a drive, which loaded it off the loop first
    # (drive.load_turns): it imports pydantic-ai, which a runner that ran no turn does not hold.
    from . import transcript

LOG_LIMIT = 10_000_000


@dataclass
class Kept:
    """A transcript a drive left here when its session went idle."""

    history: transcript.Builder
    start: int | None
    """Stream seq of the session's last message this process had published then (a hint where
    the events after ``history.seq`` begin)."""
    images: bool
    workspace: str


class LogReader:
    def __init__(self, redis: Any, store: Store, js: JetStreamContext, leases: Leases, log: Any,
                 kept: int = 0) -> None:
        self.redis = redis
        self.store = store
        self.js = js
        self.leases = leases
        self.log = log
        self.kept_max = kept
        store.outbox.recent_sessions = kept  # what a kept transcript's next turn folds (Outbox.recorded)
        self._kept: collections.OrderedDict[str, Kept] = collections.OrderedDict()
        self.folded = 0
        """Turn starts that folded a kept transcript's tail instead of rebuilding (for tests)."""
        self.first = 0
        """Turn starts whose transcript was their message alone: a session's first turn (no read)."""

    @property
    def kept(self) -> int:
        return len(self._kept)

    def keep(self, sid: str, history: transcript.Builder, files: transcript.AttachmentFiles) -> None:
        """Keep the transcript a drive leaves as its session goes idle (the oldest kept is dropped
        past ``kept_max``). Only a transcript the drive's turns kept whole, under its lease."""
        if self.kept_max <= 0:
            return
        self._kept.pop(sid, None)
        self._kept[sid] = Kept(history, self.store.outbox.position(sid), files.images, str(files.workspace))
        while len(self._kept) > self.kept_max:
            self._kept.popitem(last=False)

    def of_message(self, text: str, via: str, seq: int, files: transcript.AttachmentFiles) -> transcript.Builder:
        """The transcript of a session's first turn, begun with a text message: its log holds
        nothing else the transcript takes (the call that began the turn said so: ``fresh``), so it
        is made of the message, with no flush of the outbox and no read of JetStream."""
        from . import transcript

        self.first += 1
        return transcript.of_message(text, via, seq, files)

    async def history(self, sid: str, through: int | None, files: transcript.AttachmentFiles) -> transcript.Builder:
        """The transcript up to seq ``through``: a kept one with the events since folded in, else
        built from the whole log."""
        from . import transcript

        kept = self._kept.pop(sid, None)
        if kept is not None and kept.images == files.images and kept.workspace == str(files.workspace):
            b = await self._extend(sid, kept, through, files)
            if b is not None:
                self.folded += 1
                return b
        events = await self.read(sid, through=through)
        return await asyncio.to_thread(transcript.build, events, files)

    async def _extend(self, sid: str, kept: Kept, through: int | None,
                      files: transcript.AttachmentFiles) -> transcript.Builder | None:
        from . import transcript

        b = kept.history
        if kept.start is None:
            return None
        target = through if through is not None else int(await self.redis.hget(keys.session(sid), "seq") or 0)
        if target < b.seq:
            return None
        # What this process recorded since (the send that began the turn, usually): no wait for
        # its publish, no read of the stream (about 2 ms a turn start on a 2-core VM).
        tail = self.store.outbox.recorded(sid, b.seq, target)
        try:
            if tail is None:
                if not await self.store.outbox.flush(sid, timeout=2.0, through=target):
                    return None
                # From the message holding the first event the transcript lacks, when this process
                # published it: the position kept with the transcript was taken as the drive ended,
                # often before its last turn's events were published, and the walk from there cost
                # a direct get per message since (8 ms a turn start, five sends queued behind it).
                start = self.store.outbox.holding(sid, b.seq + 1) or kept.start
                tail = await eventlog.tail(self.js, sid, start, b.seq, target)
        except (asyncio.CancelledError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - the whole read below retries and waits
            self.log.info("log.tail_unread", sid=sid, error=logged(exc))
            return None
        if tail is None or not transcript.foldable(tail):
            return None
        if any(e.get("attachments") for e in tail):  # their files are read: off the loop
            await asyncio.to_thread(transcript.extend, b, tail, files)
        else:
            transcript.extend(b, tail, files)
        return b

    async def read(self, sid: str, through: int | None = None) -> list[dict[str, Any]]:
        """The session's whole log, at least up to the last event recorded when called (or up to
        seq ``through``, when the caller knows it: no read of the session's seq then).

        Events are recorded in Redis first and published after, so the outbox is flushed and the
        log read until it holds that seq: a turn never starts from a partial transcript. While
        NATS is down this waits (retrying) rather than run on what it has; Stop still ends it.
        """
        target = through if through is not None else int(await self.redis.hget(keys.session(sid), "seq") or 0)
        out: list[dict[str, Any]] = []
        pause = 0.05
        while True:
            d = self.leases.get(sid)
            if d is not None and d.turn is not None and d.turn.stopping:
                raise StopRequested(d.turn.stop_reason or "stop")
            try:
                await self.store.outbox.flush(sid, timeout=2.0, through=target)
                out.extend(await eventlog.backlog(self.js, sid, out[-1]["seq"] if out else 0, target,
                                                  limit=LOG_LIMIT, timeout=2.0))
                if (out[-1]["seq"] if out else 0) >= target:
                    return out
                self.log.warning("log.behind", sid=sid, have=out[-1]["seq"] if out else 0, want=target)
            except (asyncio.CancelledError, StopRequested):
                raise
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                raise
            except Exception as exc:  # noqa: BLE001 - NATS down or restarting: wait for it
                self.log.warning("log.unreadable", sid=sid, error=logged(exc))
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)
