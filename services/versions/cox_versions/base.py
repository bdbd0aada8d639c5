"""What every part of the versions service shares: the workspace a request names (under the
root), its store and git discovery, the fencing-token check of a write, the per-workspace lock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from coxswain import keys, safefs
from coxswain.config import Settings
from coxswain.errors import Fenced, Invalid, NotFound
from coxswain.service import Service

from .gitrepo import Repo
from .store import Store

REPO_CACHE_S = 2.0
"""How long a workspace's git discovery is reused (a command may ``git init`` at any time)."""


class Base(Service):
    """The state and the helpers of :class:`cox_versions.service.Versions`, which its parts use."""

    js: JetStreamContext
    """Set when the service starts."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._locks: dict[str, asyncio.Lock] = {}
        self._repos: dict[str, tuple[float, Repo | None]] = {}
        self.mac_key = b""
        self._archive_kv: KeyValue | None = None

    def workspace(self, path: str) -> Path:
        real = safefs.real_under(self.settings.root, path)
        if real is None:
            raise Invalid("the workspace is not under the configured root")
        if not real.is_dir():
            raise NotFound("the workspace folder does not exist")
        return real

    def repo(self, ws: Path) -> Repo | None:
        now = time.monotonic()
        hit = self._repos.get(str(ws))
        if hit is not None and now - hit[0] < REPO_CACHE_S:
            return hit[1]
        repo = Repo.find(ws, self.settings.root)
        self._repos[str(ws)] = (now, repo)
        return repo

    def store(self, ws: Path) -> Store:
        return Store(ws, self.settings.store_dir, self.mac_key, self.repo(ws))

    async def check_token(self, sid: str, token: int | None) -> None:
        """Writes carry the session's fencing token; a stale one is refused."""
        if token is None:
            raise Fenced("a write needs the session's fencing token")
        cur = await self.redis.get(keys.session(sid) + keys.LEASE)
        if cur is None or cur != str(token):
            raise Fenced("the fencing token is not the session's lease (stale writer)")

    def _lock(self, ws: Path) -> asyncio.Lock:
        return self._locks.setdefault(str(ws), asyncio.Lock())
