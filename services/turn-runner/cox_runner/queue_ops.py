"""A person's hand on what waits: remove or reorder queued messages before they start, and the
workspaces a new session may choose from (the caller's own and those shared with it).

Each queue change is one atomic call into the Redis library (``cox_queue_remove``,
``cox_queue_order``) that changes the queue and records it as an event together; a message that
has already started (or was discarded) is refused with 409 ``not_queued``.
"""

from __future__ import annotations

from coxswain.models import QueueOrderCmd, QueueRemoveCmd, QueueResult, WorkspacesCmd, WorkspacesResult

from .deps import Deps
from .redis.store import as_list
from .workspaces import Workspaces


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
        """The caller's own workspaces and those shared with it (cox_runner.workspaces)."""
        names = await Workspaces(self.r).listing(cmd.principal)
        return WorkspacesResult(root=str(self.r.settings.root), workspaces=names)
