"""What a command changes is versioned like a write (docs/design.md, "Versions").

Before an allowed ``run_command`` the versions service snapshots the workspace (a shadow git
index); after it, the service keeps the previous content of every file the command created,
changed or deleted (reason ``command``), so ``/versions``, ``/diff``, ``/restore`` and ``/undo``
work for them. The turn records a ``version.kept`` and a ``file.written`` (``via: "command"``)
per file, before the command's ``tool.result``.

A person's ``!command`` is versioned the same way (its events carry the turn it ran beside, if
any). A snapshot that fails or is skipped never blocks the command: it runs unversioned and the
log says so. Versions unreachable is not such a failure: the turn waits for it (:mod:`cox_runner.infra`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coxswain import events as ev
from coxswain.errors import CoxError
from coxswain.models import CommandChangesRequest, SnapshotRequest

from . import infra
from .budget import Budget
from .clients import Clients
from .deps import Deps
from .turn import Turn


async def snapshot(clients: Clients, log: Any, sid: str, workspace: str, token: int) -> str | None:
    """The snapshot id to compare against after the command, or None."""
    try:
        snap = await clients.snapshot(SnapshotRequest(sid=sid, workspace=workspace, token=token))
    except CoxError as exc:
        log.warning("command.snapshot_failed", sid=sid, error=exc.detail)
        return None
    if snap.snapshot is None:
        log.warning("command.snapshot_skipped", sid=sid, reason=snap.skipped)
    return snap.snapshot


@dataclass
class Kept:
    """What the versions service kept of a command's changes."""

    events: list[ev._Event] = field(default_factory=list)
    limit: str | None = None
    """``workspace_files`` / ``workspace_mb``: the bound that stopped the versioning."""
    note: str = ""
    """A line for the command's result saying what was not versioned, when a bound did it."""
    at_file_limit: list[str] = field(default_factory=list)


async def changes(clients: Clients, log: Any, sid: str, workspace: str, token: int, snap: str | None,
                  turn_id: str | None, call_id: str) -> Kept:
    """Keep what the command changed since ``snap``; the events that record it."""
    if snap is None:
        return Kept()
    try:
        res = await clients.after_command(CommandChangesRequest(
            sid=sid, workspace=workspace, snapshot=snap, token=token, turn_id=turn_id, call_id=call_id,
        ))
    except CoxError as exc:
        log.warning("command.versions_failed", sid=sid, error=exc.detail)
        return Kept()
    if res.skipped:
        log.info("command.not_kept", sid=sid, paths=res.skipped[:20], count=res.not_kept, limit=res.limit)
    out: list[ev._Event] = []
    for c in res.changes:
        out.append(ev.VersionKept(sid=sid, turn_id=turn_id, path=c.path, version_id=c.version_id, store=c.store))
        out.append(ev.FileWritten(sid=sid, turn_id=turn_id, path=c.path, added=c.added, removed=c.removed,
                                  via="command", deleted=c.deleted))
    return Kept(out, res.limit, res.note, res.at_file_limit)


async def before(deps: Deps, turn: Turn, budget: Budget, log: Any) -> str | None:
    """The turn's snapshot before its command. Versions unreachable is waited for (a snapshot
    only reads), else the turn ends ``unavailable``."""
    req = SnapshotRequest(sid=turn.sid, workspace=str(turn.workspace), token=int(turn.token))
    try:
        snap = await infra.call(deps, turn, budget, log, "versions", lambda _: deps.clients.snapshot(req))
    except CoxError as exc:
        log.warning("command.snapshot_failed", sid=turn.sid, error=exc.detail)
        return None
    if snap.snapshot is None:
        log.warning("command.snapshot_skipped", sid=turn.sid, reason=snap.skipped)
    return snap.snapshot


async def after(deps: Deps, turn: Turn, log: Any, call_id: str, snap: str | None) -> Kept:
    """Keep what the turn's command changed; the events that record it."""
    return await changes(deps.clients, log, turn.sid, str(turn.workspace), int(turn.token), snap,
                         turn.turn_id, call_id)
