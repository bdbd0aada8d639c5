"""What a command changes is versioned like a write (DESIGN "Versions"; issue 5).

Before an allowed ``run_command`` the versions service snapshots the workspace (a shadow git
index); after it, the service keeps the previous content of every file the command created,
changed or deleted (reason ``command``), so ``/versions``, ``/diff``, ``/restore`` and ``/undo``
work for them. The turn records a ``version.kept`` and a ``file.written`` (``via: "command"``)
per file, before the command's ``tool.result``.

A person's ``!command`` is versioned the same way (its events carry the turn it ran beside, if
any). A snapshot that fails or is skipped never blocks the command: it runs unversioned and the
log says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coxswain import events as ev
from coxswain.errors import CoxError
from coxswain.models import CommandChangesRequest, SnapshotRequest

if TYPE_CHECKING:
    from .clients import Clients
    from .loop import TurnLoop


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


async def changes(clients: Clients, log: Any, sid: str, workspace: str, token: int, snap: str | None,
                  turn_id: str | None, call_id: str) -> list[ev._Event]:
    """Keep what the command changed since ``snap``; the events that record it."""
    if snap is None:
        return []
    try:
        res = await clients.after_command(CommandChangesRequest(
            sid=sid, workspace=workspace, snapshot=snap, token=token, turn_id=turn_id, call_id=call_id,
        ))
    except CoxError as exc:
        log.warning("command.versions_failed", sid=sid, error=exc.detail)
        return []
    if res.skipped:
        log.info("command.not_kept", sid=sid, paths=res.skipped[:20])
    out: list[ev._Event] = []
    for c in res.changes:
        out.append(ev.VersionKept(sid=sid, turn_id=turn_id, path=c.path, version_id=c.version_id, store=c.store))
        out.append(ev.FileWritten(sid=sid, turn_id=turn_id, path=c.path, added=c.added, removed=c.removed,
                                  via="command", deleted=c.deleted))
    return out


async def before(loop: TurnLoop) -> str | None:
    """The turn's snapshot before its command."""
    t = loop.turn
    return await snapshot(loop.runner.clients, loop.log, t.sid, str(t.workspace), int(t.token))


async def after(loop: TurnLoop, call_id: str, snap: str | None) -> list[ev._Event]:
    """Keep what the turn's command changed; the events that record it."""
    t = loop.turn
    return await changes(loop.runner.clients, loop.log, t.sid, str(t.workspace), int(t.token), snap,
                         t.turn_id, call_id)
