"""Typed calls from the runner to guard, judge and versions over NATS request-reply."""

from __future__ import annotations

from nats.aio.client import Client

from coxswain import bus, subjects
from coxswain.models import (
    CommandChangesRequest,
    CommandChangesResult,
    DiffRequest,
    DiffResult,
    GuardRequest,
    GuardResult,
    JudgeRequest,
    JudgeResult,
    KeepRequest,
    KeepResult,
    RestoreRequest,
    SnapshotRequest,
    SnapshotResult,
    UndoRequest,
    WriteOutcome,
)


class Clients:
    def __init__(self, nc: Client, judge_timeout: float = 30.0) -> None:
        self.nc = nc
        self.judge_timeout = judge_timeout

    async def guard(self, req: GuardRequest) -> GuardResult:
        return await bus.call(self.nc, subjects.rpc(subjects.GUARD, "check"), req, GuardResult, timeout=10)

    async def judge(self, req: JudgeRequest) -> JudgeResult:
        return await bus.call(self.nc, subjects.rpc(subjects.JUDGE, "decide"), req, JudgeResult,
                              timeout=self.judge_timeout)

    async def keep(self, req: KeepRequest) -> KeepResult:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "keep"), req, KeepResult, timeout=30)

    async def restore(self, req: RestoreRequest) -> WriteOutcome:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "restore"), req, WriteOutcome, timeout=30)

    async def undo(self, req: UndoRequest) -> WriteOutcome:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "undo"), req, WriteOutcome, timeout=30)

    async def diff(self, req: DiffRequest) -> DiffResult:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "diff"), req, DiffResult, timeout=30)

    async def snapshot(self, req: SnapshotRequest) -> SnapshotResult:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "snapshot"), req, SnapshotResult, timeout=90)

    async def after_command(self, req: CommandChangesRequest) -> CommandChangesResult:
        return await bus.call(self.nc, subjects.rpc(subjects.VERSIONS, "after"), req, CommandChangesResult,
                              timeout=120)
