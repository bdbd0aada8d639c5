"""Retention: collect one workspace's store, or every store under the root, by the policy
(:mod:`cox_versions.retention`), on request and every ``[versions] gc_interval_s``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from coxswain.errors import CoxError, logged
from coxswain.models import (
    CollectRequest,
    CollectResult,
)

from .base import Base
from .retention import DAY_S, Policy, StoreStats, collect_store
from .shadow import Shadow


class Collector(Base):
    """The retention policy applied, per workspace under its lock."""

    def policy(self) -> Policy:
        v = self.settings.versions
        return Policy(keep_days=v.keep_days, keep_per_file=v.keep_per_file)

    async def collect(self, req: CollectRequest) -> CollectResult:
        """Collect one workspace, or every workspace folder under the root, by the retention policy."""
        t0 = time.perf_counter()
        if req.workspace is not None:
            spaces = [self.workspace(req.workspace)]
        else:
            spaces = await asyncio.to_thread(self._stored_workspaces)
        total = CollectResult(workspaces=0, versions_kept=0, versions_removed=0, objects_removed=0, bytes_freed=0,
                              shadow_indexes_removed=0, shadow_objects_removed=0, ms=0.0)
        for ws in spaces:
            try:
                async with self._lock(ws):
                    st, (indexes, objects) = await asyncio.to_thread(self._collect_one, ws)
            except (CoxError, OSError) as exc:
                if req.workspace is not None:
                    raise
                # One workspace whose store folder was tampered with must not stop the others.
                total.failed.append(f"{ws.name}: {exc.detail if isinstance(exc, CoxError) else exc}")
                self.log.warning("versions.collect_failed", workspace=str(ws), error=logged(exc))
                continue
            total.workspaces += 1
            total.versions_kept += st.kept
            total.versions_removed += st.removed
            total.objects_removed += st.objects_removed
            total.bytes_freed += st.bytes_freed
            total.shadow_indexes_removed += indexes
            total.shadow_objects_removed += objects
        total.ms = round((time.perf_counter() - t0) * 1000, 2)
        self.log.info("versions.collected", **total.model_dump())
        return total

    def _collect_one(self, ws: Path) -> tuple[StoreStats, tuple[int, int]]:
        policy = self.policy()
        st = collect_store(self.store(ws), policy)
        idle = None if policy.keep_days == 0 else policy.keep_days * DAY_S
        return st, Shadow(ws, self.settings.store_dir).collect(idle)

    def _stored_workspaces(self) -> list[Path]:
        """The workspace folders under the root that have a versions store."""
        try:
            entries = list(os.scandir(self.settings.root))
        except FileNotFoundError:
            return []
        return [Path(e.path) for e in sorted(entries, key=lambda e: e.name)
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
                and os.path.isdir(os.path.join(e.path, self.settings.store_dir))]

    async def _collect_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect(CollectRequest())
            except Exception as exc:  # noqa: BLE001 - a failed round must not stop the next one
                self.log.warning("versions.collect_failed", error=logged(exc))
