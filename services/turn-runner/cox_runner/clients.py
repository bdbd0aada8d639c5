"""Typed calls from the runner to guard, judge and versions over NATS request-reply
(the operations and their time-outs are :mod:`coxswain.rpc`'s), and the usage samples it sends
the gateways."""

from __future__ import annotations

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


class Clients:
    def __init__(self, nc: Client, settings: Settings) -> None:
        self.nc = nc
        self.settings = settings

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
        """One model request's usage (a ``usage`` event's fields), for the gateways' ``/metrics``
        (core NATS, best effort)."""
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.USAGE_METRICS, json.dumps(sample).encode())
