"""Waiting for the services a turn needs: guard, the judge, versions (and the bus under them).

A failure of the infrastructure (:class:`~coxswain.errors.Unavailable`: the bus is not
connected, nobody answers, no answer in time) is never a tool outcome. The turn waits for the
service (backoff, bounded by ``[runner] infra_wait_s``; Stop and steer end the wait at once)
and calls again, then ends ``unavailable`` naming the service. Every call made so is safe to
repeat: guard and the judge only decide; versions keeps once per ``call_id`` (``again``), and a
snapshot only reads. Time spent waiting is not work time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from coxswain.errors import Unavailable

from .budget import Budget
from .deps import Deps
from .turn import Ending, EndTurn, Turn, guarded

T = TypeVar("T")
FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0


async def call(deps: Deps, turn: Turn, budget: Budget, log: Any, service: str,
               fn: Callable[[int], Awaitable[T]]) -> T:
    """``fn(attempt)``, again while ``service`` is unavailable, within the bound."""
    bound = deps.settings.runner.infra_wait_s
    t0 = time.monotonic()
    pause = FIRST_PAUSE_S
    attempt = 0
    while True:
        try:
            return await fn(attempt)
        except Unavailable as exc:
            deps.health.failed()
            waited = time.monotonic() - t0
            if waited >= bound:
                log.warning("infra.gave_up", service=service, waited_s=round(waited, 3), error=exc.detail)
                raise EndTurn(Ending("unavailable", detail=f"{service} could not be reached for "
                                                           f"{waited:.1f}s: {exc.detail}")) from exc
            if attempt == 0:
                log.warning("infra.waiting", service=service, error=exc.detail)
        attempt += 1
        started = time.monotonic()
        try:
            await guarded(turn, asyncio.sleep(min(pause, max(0.0, bound - (time.monotonic() - t0)))))
        finally:
            budget.waited += time.monotonic() - started
        pause = min(MAX_PAUSE_S, pause * 2)
