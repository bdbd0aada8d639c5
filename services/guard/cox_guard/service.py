"""The guard service: a policy decision for every tool call, over NATS request-reply."""

from __future__ import annotations

import asyncio

from coxswain import rpc, subjects
from coxswain.models import GuardRequest, GuardResult
from coxswain.service import Service

from . import policy


class Guard(Service):
    name = subjects.GUARD

    async def start(self) -> None:
        await self.endpoint(rpc.GUARD_CHECK, self.check)

    async def check(self, req: GuardRequest) -> GuardResult:
        # Writes read the current file, diff it and scan the content; commands look at the
        # workspace for taint. Both block, so they run off the event loop.
        if req.call.name in (*policy.WRITES, "run_command", "find_files", "search_text"):
            return await asyncio.to_thread(policy.check, self.settings, req)
        return policy.check(self.settings, req)


def main() -> None:
    from coxswain.service import run

    run(Guard, subjects.GUARD)
