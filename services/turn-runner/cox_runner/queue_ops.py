"""A person's hand on what waits: remove or reorder queued messages before they start, and the
workspaces a new session may choose from.

Each queue change is one atomic call into the Redis library (``cox_queue_remove``,
``cox_queue_order``) that changes the queue and records it as an event together; a message that
has already started (or was discarded) is refused with 409 ``not_queued``.
"""

from __future__ import annotations

import asyncio
import os

from coxswain import safefs
from coxswain.models import QueueOrderCmd, QueueRemoveCmd, QueueResult, WorkspacesCmd, WorkspacesResult

from .deps import Deps
from .store import as_list

MAX_WORKSPACES = 1000


class QueueOps:
    def __init__(self, deps: Deps) -> None:
        self.r = deps

    async def remove(self, cmd: QueueRemoveCmd) -> QueueResult:
        res = await self.r.store.fns.queue_remove(sid=cmd.sid, principal=cmd.principal, message_id=cmd.message_id,
                                                  owner=self.r.owner)
        return QueueResult(queue=[str(x) for x in as_list(res.get("queue"))], removed=cmd.message_id)

    async def order(self, cmd: QueueOrderCmd) -> QueueResult:
        res = await self.r.store.fns.queue_order(sid=cmd.sid, principal=cmd.principal, owner=self.r.owner,
                                                 message_ids=cmd.message_ids)
        return QueueResult(queue=[str(x) for x in as_list(res.get("queue"))], changed=bool(res.get("changed")))

    async def workspaces(self, cmd: WorkspacesCmd) -> WorkspacesResult:
        root = self.r.settings.root
        return WorkspacesResult(root=str(root), workspaces=await asyncio.to_thread(_folders, root))


def _folders(root: os.PathLike[str]) -> list[str]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    out = [e.name for e in entries
           if not e.name.startswith(".") and e.is_dir(follow_symlinks=False) and not safefs.denied(e.name)]
    return sorted(out)[:MAX_WORKSPACES]
