"""What the runner's parts need from the process, handed down instead of the whole ``Runner``.

The service builds one :class:`Deps` at start and gives it to admission, drives and turns.
Nothing here imports the service: every import in the runner points downwards (the layers are
listed in ``cox_runner/__init__.py``). Deps holds resources, each an object with its own home,
and the parts take what they use:

- ``store`` (Redis, its pooled connections dropped after a failure: ``Store.drop_idle``),
  ``leases`` (the drives held here; ``Leases.ensure`` checks a lease before a file write),
  ``clients`` (guard, the judge, versions; ``Clients.usage_seen`` for the gateways' metrics);
- ``events`` (:class:`LogReader`: a session's whole log), ``doorbell`` (:class:`Doorbell`: ring
  the holder of a session), ``health`` (:class:`Health`: the services a turn needs);
- ``run_slots`` (:class:`RunSlots`: a run turn waits for one of ``[runs] max_active`` slots);
- ``process``: the one narrow handle on the process itself (:class:`Process`): whether it is
  shutting down, and a task it keeps (a drive runs as one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from coxswain.config import Settings

from .clients import Clients
from .doorbell import Doorbell
from .health import Health
from .leases import Leases
from .logreader import LogReader
from .model.providers import Models
from .redis.store import Store
from .runslots import RunSlots
from .workspace.sandbox import Sandbox


class Process(Protocol):
    """What a part may ask of the process (a :class:`coxswain.service.Service`)."""

    @property
    def stopping(self) -> bool:
        """The process is shutting down: hand the queue on instead of starting the next turn."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, critical: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` as a task the process keeps, cancels and awaits on stop (a drive)."""
        ...


@dataclass
class Deps:
    settings: Settings
    log: Any
    redis: Any
    """The Redis client (``decode_responses=True``); ``Any`` as in :class:`coxswain.service.Service`."""
    store: Store
    clients: Clients
    models: Models
    sandbox: Sandbox
    owner: str
    """This runner's id: the owner name its Redis calls carry."""
    leases: Leases
    events: LogReader
    doorbell: Doorbell
    health: Health
    process: Process
    run_slots: RunSlots
    """The stack's bound on run turns at once, this runner's side (``[runs] max_active``)."""
    programs: Any = None
    """The session programs running here (:class:`cox_runner.programs.Programs`; set at start)."""
