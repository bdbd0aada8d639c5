"""What a command changes is versioned like a write (DESIGN "Versions"; issue 5).

Before an allowed ``run_command`` the versions service snapshots the workspace (a shadow git
index); after it, the service keeps the previous content of every file the command created,
changed or deleted (reason ``command``), so ``/versions``, ``/diff``, ``/restore`` and ``/undo``
work for them. The turn records a ``version.kept`` and a ``file.written`` (``via: "command"``)
per file, before the command's ``tool.result``.

A snapshot that fails or is skipped never blocks the command: it runs unversioned and the log
says so. Versions unreachable is not such a failure: the turn waits for it (``TurnLoop.infra``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coxswain import events as ev
from coxswain.errors import CoxError
from coxswain.models import CommandChangesRequest, SnapshotRequest

if TYPE_CHECKING:
    from .loop import TurnLoop


async def before(loop: TurnLoop) -> str | None:
    """The snapshot id to compare against after the command, or None."""
    t = loop.turn
    req = SnapshotRequest(sid=t.sid, workspace=str(t.workspace), token=int(t.token))
    try:
        # versions unreachable: waited for (a snapshot only reads), else the turn ends unavailable
        snap = await loop.infra("versions", lambda _: loop.runner.clients.snapshot(req))
    except CoxError as exc:
        loop.log.warning("command.snapshot_failed", error=exc.detail)
        return None
    if snap.snapshot is None:
        loop.log.warning("command.snapshot_skipped", reason=snap.skipped)
    return snap.snapshot


async def after(loop: TurnLoop, call_id: str, snapshot: str | None) -> list[ev._Event]:
    """Keep what the command changed; the events that record it."""
    if snapshot is None:
        return []
    t = loop.turn
    try:
        res = await loop.runner.clients.after_command(CommandChangesRequest(
            sid=t.sid, workspace=str(t.workspace), snapshot=snapshot, token=int(t.token), turn_id=t.turn_id,
            call_id=call_id,
        ))
    except CoxError as exc:
        loop.log.warning("command.versions_failed", error=exc.detail)
        return []
    if res.skipped:
        loop.log.info("command.not_kept", paths=res.skipped[:20])
    out: list[ev._Event] = []
    for c in res.changes:
        out.append(ev.VersionKept(sid=t.sid, turn_id=t.turn_id, path=c.path, version_id=c.version_id, store=c.store))
        out.append(ev.FileWritten(sid=t.sid, turn_id=t.turn_id, path=c.path, added=c.added, removed=c.removed,
                                  via="command", deleted=c.deleted))
    return out
