"""Typed calls from the runner to guard, judge and versions over NATS request-reply
(the operations and their time-outs are :mod:`coxswain.rpc`'s), and the usage it sends the
gateways (summed over :data:`USAGE_FLUSH_S`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from nats.aio.client import Client

from coxswain import rpc, subjects
from coxswain.config import Settings
from coxswain.models import (
    CommandChangesRequest,
    CommandChangesResult,
    DiffRequest,
    DiffResult,
    ForkFilesRequest,
    ForkFilesResult,
    GuardRequest,
    GuardResult,
    JudgeRequest,
    JudgeResult,
    KeepRequest,
    KeepResult,
    RestoreRequest,
    RewindFilesRequest,
    RewindFilesResult,
    SnapshotRequest,
    SnapshotResult,
    UndoRequest,
    WriteOutcome,
)

USAGE_FLUSH_S = 0.5
"""How long model requests' usage is summed before it goes to the gateways' ``/metrics``: one
message then instead of one per model request (four a turn of three tool rounds)."""

USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


class Clients:
    def __init__(self, nc: Client, settings: Settings) -> None:
        self.nc = nc
        self.settings = settings
        self._usage: dict[tuple[str, str], dict[str, Any]] = {}
        self._usage_flush: asyncio.Task[None] | None = None

    async def guard(self, req: GuardRequest) -> GuardResult:
        return await rpc.call(self.nc, rpc.GUARD_CHECK, req)

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        return await rpc.call(self.nc, rpc.JUDGE_DECIDE, req, settings=self.settings)

    async def keep(self, req: KeepRequest) -> KeepResult:
        return await rpc.call(self.nc, rpc.VERSIONS_KEEP, req)

    async def restore(self, req: RestoreRequest) -> WriteOutcome:
        return await rpc.call(self.nc, rpc.VERSIONS_RESTORE, req)

    async def undo(self, req: UndoRequest) -> WriteOutcome:
        return await rpc.call(self.nc, rpc.VERSIONS_UNDO, req)

    async def diff(self, req: DiffRequest) -> DiffResult:
        return await rpc.call(self.nc, rpc.VERSIONS_DIFF, req)

    async def snapshot(self, req: SnapshotRequest) -> SnapshotResult:
        return await rpc.call(self.nc, rpc.VERSIONS_SNAPSHOT, req)

    async def after_command(self, req: CommandChangesRequest) -> CommandChangesResult:
        return await rpc.call(self.nc, rpc.VERSIONS_AFTER, req)

    async def fork_files(self, req: ForkFilesRequest) -> ForkFilesResult:
        return await rpc.call(self.nc, rpc.VERSIONS_FORK, req)

    async def rewind_files(self, req: RewindFilesRequest) -> RewindFilesResult:
        return await rpc.call(self.nc, rpc.VERSIONS_REWIND, req)

    async def usage_seen(self, sample: dict[str, Any]) -> None:
        """One model request's usage (a ``usage`` event's fields), for the gateways' ``/metrics``:
        added to its model's and purpose's sum, which goes out within :data:`USAGE_FLUSH_S`
        (core NATS, best effort; :meth:`flush_usage` on the way out)."""
        key = (str(sample.get("model", "")), str(sample.get("purpose", "")))
        total = self._usage.get(key)
        if total is None:
            total = self._usage[key] = {"model": key[0], "purpose": key[1], "requests": 0, "cost": 0.0,
                                        **dict.fromkeys(USAGE_COUNTS, 0)}
        total["requests"] += 1
        for k in USAGE_COUNTS:
            n = sample.get(k)
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                total[k] += n
        cost = sample.get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost > 0:
            total["cost"] += float(cost)
        if self._usage_flush is None:  # kept here: the loop holds a task only weakly
            self._usage_flush = asyncio.create_task(self._flush_later(), name="usage-flush")

    async def _flush_later(self) -> None:
        await asyncio.sleep(USAGE_FLUSH_S)
        self._usage_flush = None
        await self.flush_usage()

    async def flush_usage(self) -> None:
        """Send the usage summed so far (a JSON list of ``{model, purpose, requests, *_tokens, cost}``)."""
        pending, self._usage_flush = self._usage_flush, None
        if pending is not None:
            pending.cancel()
        sums, self._usage = list(self._usage.values()), {}
        if sums:
            with contextlib.suppress(Exception):
                await self.nc.publish(subjects.USAGE_METRICS, json.dumps(sums).encode())
