"""Fork and rewind (docs/api.md, "Fork and rewind"; docs/design.md, "Fork and rewind").

Turns are numbered from 1 in the order they started (:mod:`coxswain.turns`). Both read the log,
which says where a turn ended (its ``turn.end`` seq) and which versions its writes kept (the
``version.kept`` events): the files as they were at the end of a turn are the files now with
every later write of the session put back, which the versions service does from the versions
those later writes kept (shell writes included: a command's snapshot keeps what it changed).

- **Fork** reads only (the source's log and versions store): it works while the source is busy,
  at any turn that has ended. The new session is made in one Redis call (``cox_fork``: as
  ``cox_create`` makes one, its log beginning with the copied transcript and ``session.forked``);
  its folder is the source's copied beside it (``<name>-fork-<n>``), store folder left out, a
  workspace of the forking principal (claimed before the copy: cox_runner.workspaces).
- **Rewind** is a person's operation between turns, under the idle session's lease like restore
  (409 ``busy`` while a turn runs): files are put back through the versions service (each kept
  first, undoable as one), and one ``session.rewound`` records it, with its ``file.written``.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from coxswain import events as ev
from coxswain import keys, session_view
from coxswain.errors import Busy, Conflict, Invalid, NotFound, WorkspaceNested
from coxswain.ids import new_id
from coxswain.models import (
    ForkCmd,
    ForkFilesRequest,
    RewindCmd,
    RewindFilesRequest,
    RewindResult,
    Session,
)
from coxswain.turns import CONVERSATION_SCOPES, FILE_SCOPES, FORKED, REWOUND, TurnSpan, rewound, turns

from .admission import Admission

NOT_COPIED = frozenset({
    "session.created", FORKED, REWOUND, "assistant.delta", "title.set", "session.updated",
    "queue.added", "queue.removed", "queue.reordered", "queue.discarded", "run.start", "run.end",
})
"""Events a fork's log does not take over: the source's own settings and queue, streamed text
(``assistant.msg`` holds it whole), rewinds (already applied to what is copied) and the source's
run (a fork is a chat)."""
FORK_SUFFIX = re.compile(r"-fork-\d+$")
MAX_NAME_TRIES = 100


def _turn(spans: list[TurnSpan], n: int) -> TurnSpan:
    if n > len(spans):
        have = f"turns 1 to {len(spans)}" if spans else "no turns yet"
        raise Invalid(f"there is no turn {n}: the session has {have}")
    span = spans[n - 1]
    if span.end_seq is None:
        raise Busy(f"turn {n} is still running: choose a turn that has ended")
    return span


def _files_reachable(events: list[dict[str, Any]], through: int, n: int) -> None:
    """A fork's store begins at the fork (the end of its last copied turn): the files of the
    turns before it are kept in the source's store."""
    forked = next((e for e in events if e.get("type") == FORKED), None)
    if forked is None:
        return
    at = int(forked.get("seq") or 0)
    point = max((int(e.get("seq") or 0) for e in events
                 if e.get("type") == "turn.end" and int(e.get("seq") or 0) < at), default=0)
    if through < point:
        raise Invalid(f"turn {n} was copied from session {forked.get('from_sid')} when this session was forked: "
                      "its files are kept there (rewind or fork that session, or rewind the conversation only)")


def _versions(events: list[dict[str, Any]], through: int) -> tuple[list[str], list[str]]:
    """The versions the log recorded up to ``through`` and after it."""
    known: list[str] = []
    later: list[str] = []
    for e in events:
        if e.get("type") == "version.kept" and e.get("version_id"):
            (known if int(e.get("seq") or 0) <= through else later).append(str(e["version_id"]))
    return known, later


def copied_events(events: list[dict[str, Any]], new_sid: str, first_seq: int) -> list[str]:
    """The bodies of the events a fork's log begins with (seq ``first_seq`` on): the transcript
    ``events`` leaves (rewinds applied), renumbered, a compaction's ``through_seq`` mapped to
    the new seqs."""
    olds: list[int] = []
    news: list[int] = []
    out: list[str] = []
    for e in rewound(events):
        if e.get("type") in NOT_COPIED:
            continue
        d = dict(e)
        old = int(d.pop("seq", 0) or 0)
        d.pop("ts", None)
        d["sid"] = new_sid
        if d.get("type") == "context.compacted":
            i = bisect.bisect_right(olds, int(d.get("through_seq") or 0))
            d["through_seq"] = news[i - 1] if i else 0
        olds.append(old)
        news.append(first_seq + len(out))
        out.append(json.dumps(d, ensure_ascii=False, separators=(",", ":")))
    return out


class Forks:
    def __init__(self, admission: Admission) -> None:
        self.a = admission
        self.r = admission.r

    async def _owned(self, sid: str, principal: str) -> dict[str, str]:
        h: dict[str, str] = await self.r.redis.hgetall(keys.session(sid))
        if not h or h.get("principal") != principal:
            raise NotFound("no such session")
        return h

    # ------------------------------------------------------------------ fork
    async def fork(self, cmd: ForkCmd) -> Session:
        r = self.r
        h = await self._owned(cmd.sid, cmd.principal)
        events = await r.events.read(cmd.sid)
        span = _turn(turns(events), cmd.at_turn)
        through = int(span.end_seq or 0)
        _files_reachable(events, through, cmd.at_turn)
        upto = [e for e in events if int(e.get("seq") or 0) <= through]
        known, later = _versions(events, through)
        src = Path(h["workspace"])
        root = Path(await asyncio.to_thread(lambda: r.settings.root.resolve()))
        parent, name = (src.parent, src.name) if src != root else (root, "workspace")
        name = FORK_SUFFIX.sub("", name)
        sid = new_id("s")
        files = None
        spaces = self.a.workspaces
        for n in range(1, MAX_NAME_TRIES + 1):
            target = parent / f"{name}-fork-{n}"
            if await asyncio.to_thread(target.exists):
                continue
            # The fork's folder is the forking principal's workspace: claimed first (a name another
            # principal owns, or one inside or around a workspace, is skipped), released if unused.
            wname = os.path.relpath(target, root).replace(os.sep, "/")
            try:
                if await spaces.claim(wname, cmd.principal) != cmd.principal:
                    continue
            except WorkspaceNested:
                continue
            try:
                files = await r.clients.fork_files(ForkFilesRequest(sid=cmd.sid, workspace=str(src),
                                                                    target=str(target), known=known, later=later))
                break
            except Conflict:
                await spaces.release(wname, cmd.principal)
                continue  # taken meanwhile: the next name
            except BaseException:
                await spaces.release(wname, cmd.principal)
                raise
        if files is None:
            raise Conflict(f"no free folder name like {name}-fork-N beside the workspace")
        title = f"{h['title']} (fork)" if h.get("title") else ""
        model = h.get("model") or ""
        created = ev.body(ev.SessionCreated(sid=sid, workspace=str(target), model=model or None, title=title or None,
                                            source="manual" if title else None))
        bodies = copied_events(upto, sid, first_seq=2)
        bodies.append(ev.body(ev.SessionForked(sid=sid, from_sid=cmd.sid, at_turn=cmd.at_turn, through_seq=through,
                                               workspace=str(src), restored_files=files.restored_files)))
        try:
            await r.store.fns.fork(sid=sid, principal=cmd.principal, workspace=str(target), model=model, title=title,
                                   owner=r.owner, body=created, events=bodies)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, target, True)
            await spaces.release(wname, cmd.principal)
            raise
        r.log.info("session.forked", sid=sid, from_sid=cmd.sid, at_turn=cmd.at_turn, events=len(bodies),
                   copied=files.copied, restored=len(files.restored_files))
        view = await session_view.load(r.redis, sid, cmd.principal, r.settings.sandbox)
        assert view is not None
        return view

    # ------------------------------------------------------------------ rewind
    async def rewind(self, cmd: RewindCmd) -> RewindResult:
        r = self.r
        async with self.a._op_lease(cmd.sid, cmd.principal, "rewind") as token:
            events = await r.events.read(cmd.sid)
            span = _turn(turns(events), cmd.to_turn)
            through = int(span.end_seq or 0)
            restored: list[Any] = []
            evs: list[str] = []
            if cmd.scope in FILE_SCOPES:
                _files_reachable(events, through, cmd.to_turn)
                known, later = _versions(events, through)
                ws = await r.redis.hget(keys.session(cmd.sid), "workspace") or ""
                out = await r.clients.rewind_files(RewindFilesRequest(
                    sid=cmd.sid, workspace=ws, token=int(token), known=known, later=later, rewind_id=new_id("rw")))
                restored = out.files
                for f in restored:
                    evs += [ev.body(ev.VersionKept(sid=cmd.sid, path=f.kept.path, version_id=f.kept.version_id,
                                                   store=f.kept.store)),
                            ev.body(ev.FileWritten(sid=cmd.sid, path=f.path, added=f.added, removed=f.removed,
                                                   via="rewind", deleted=f.deleted))]
            paths = [f.path for f in restored]
            evs.append(ev.body(ev.SessionRewound(sid=cmd.sid, to_turn=cmd.to_turn, scope=cmd.scope,
                                                 through_seq=through, restored_files=paths)))
            # A plan left by a later turn is not carried into a conversation that never had it.
            ops = [("hdel", "", "plan", "")] if cmd.scope in CONVERSATION_SCOPES else []
            await r.store.fns.emit(sid=cmd.sid, token=token, owner=r.owner, ops=ops, events=evs)
            return RewindResult(to_turn=cmd.to_turn, scope=cmd.scope, through_seq=through, restored_files=paths,
                                files=restored)
