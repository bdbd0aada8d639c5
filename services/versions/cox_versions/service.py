"""The versions service: keep before every write, list, diff, restore, undo, command snapshots, changes.

Requests come from runners (keep, restore, undo, snapshot, after: writes, checked against the
session's fencing token) and from the gateway (list, diff, changes: reads). Workspaces must lie
under the configured root; paths are resolved beneath the workspace and checked against the
denylist; every record read back is checked (see :mod:`cox_versions.store`).
"""

from __future__ import annotations

import secrets
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from coxswain import keys, rpc, subjects

from .collector import Collector
from .commands import Commands
from .forks import Forks
from .reads import Reads


class Versions(Forks, Commands, Collector, Reads):
    """The service, one part per area of its requests: :mod:`~cox_versions.writes` (keep,
    restore, undo), :mod:`~cox_versions.commands` (command snapshots), :mod:`~cox_versions.forks`
    (fork, rewind), :mod:`~cox_versions.collector` (retention) and :mod:`~cox_versions.reads`
    (list, diff, changes), each on :class:`~cox_versions.base.Base` (workspace, store, token, lock)."""

    name = subjects.VERSIONS
    uses_redis = True

    async def start(self) -> None:
        # Every Redis call here is idempotent (GET, HGET, SET NX): retried on a broken connection.
        # A pooled connection that a Redis restart closed (busy or idle) fails once and is
        # replaced, instead of failing a write's keep with "Connection closed by server".
        self.redis.set_retry(Retry(ExponentialBackoff(cap=0.5, base=0.05), 6))
        # The key that makes index lines members of the store: in Redis, out of the model's reach.
        await self.redis.set(keys.VERSIONS_MAC_KEY, secrets.token_hex(32), nx=True)
        self.mac_key = bytes.fromhex(await self.redis.get(keys.VERSIONS_MAC_KEY))
        self.js = self.nc.jetstream()
        await self.endpoint(rpc.VERSIONS_KEEP, self.keep)
        await self.endpoint(rpc.VERSIONS_LIST, self.list)
        await self.endpoint(rpc.VERSIONS_DIFF, self.diff)
        await self.endpoint(rpc.VERSIONS_RESTORE, self.restore)
        await self.endpoint(rpc.VERSIONS_UNDO, self.undo)
        await self.endpoint(rpc.VERSIONS_CHANGES, self.changes)
        await self.endpoint(rpc.VERSIONS_UNDO_TARGET, self.undo_target)
        await self.endpoint(rpc.VERSIONS_SNAPSHOT, self.snapshot)
        await self.endpoint(rpc.VERSIONS_AFTER, self.after)
        await self.endpoint(rpc.VERSIONS_COLLECT, self.collect)
        await self.endpoint(rpc.VERSIONS_FORK, self.fork)
        await self.endpoint(rpc.VERSIONS_REWIND, self.rewind)
        self.spawn(self._collect_every(self.settings.versions.gc_interval_s), "collector")

    async def health(self) -> dict[str, Any]:
        await self.redis.ping()
        return {}


def main() -> None:
    from coxswain.service import run

    run(Versions, subjects.VERSIONS)
