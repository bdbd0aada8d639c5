"""Whether the services a turn needs answer now: the bus, guard, versions (and the judge when
commands go to it). One :class:`Health` per runner, shared by its drives."""

from __future__ import annotations

import time

from nats.aio.client import Client

from coxswain import rpc, subjects
from coxswain.config import Settings
from coxswain.errors import CoxError

INFRA_CHECK_S = 0.2
"""How long one look at the services' health serves every drive that asks."""


class Health:
    def __init__(self, nc: Client, settings: Settings) -> None:
        self.nc = nc
        self.needed = (subjects.GUARD, subjects.VERSIONS) + (
            (subjects.JUDGE,) if settings.approval.commands == "judge" else ())
        self._suspect = False
        self._checked: tuple[float, str | None] | None = None

    def failed(self) -> None:
        """A turn met a service or the bus unavailable: look before starting the next turn."""
        self._suspect = True

    async def missing(self) -> str | None:
        """What a turn needs that does not answer now (the bus, guard, versions, the judge when
        commands go to it), or None. Cheap while nothing has failed: only the bus's state is
        looked at; after a failure each service's health is asked (shared for a moment by every
        drive asking at once)."""
        if not self.nc.is_connected:
            self._suspect = True
            return "the message bus"
        if not self._suspect:
            return None
        now = time.monotonic()
        if self._checked is not None and now - self._checked[0] < INFRA_CHECK_S:
            return self._checked[1]
        missing: str | None = None
        for svc in self.needed:
            try:
                await rpc.call(self.nc, rpc.HEALTH[svc], rpc.NoRequest())
            except CoxError:
                missing = svc
                break
        self._checked = (time.monotonic(), missing)
        if missing is None:
            self._suspect = False
        return missing
