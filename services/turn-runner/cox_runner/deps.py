"""What the runner's parts need from the process, handed down instead of the whole ``Runner``.

The service builds one :class:`Deps` at start and gives it to admission, drives and turns.
Nothing here imports the service: the direction of every import in the runner is downwards
(``service`` → ``admission`` → ``drive`` → ``loop`` → its parts → ``deps``, ``store``, ``tools``).
The few things only the process can do (ring another runner's doorbell, start a drive, read a
session's whole log, check the lease before a file write) are callables on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from coxswain.config import Settings

from .clients import Clients
from .leases import Drive, Leases
from .model.providers import Models
from .redis.store import Store
from .workspace.sandbox import Sandbox


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
    read_events: Callable[[str], Awaitable[list[dict[str, Any]]]]
    """A session's whole log, at least up to the last event recorded when called."""
    ensure_lease: Callable[[str, str, str, str], Awaitable[None]]
    """(sid, token, call_id, intent): raise LeaseLost unless the lease is still ours; records a
    file write's intent under the token in the same call."""
    redis_failed: Callable[[], Awaitable[None]]
    """Drop idle pooled Redis connections after a failure (a restarted server closed them)."""
    stopping: Callable[[], bool]
    """The process is shutting down: hand the queue on instead of starting the next turn."""
    ring: Callable[[Any, str, str], Awaitable[None]]
    """(runner_id, sid, kind): tell the runner holding ``sid`` to look again (a doorbell)."""
    start_drive: Callable[[Drive], None]
    """Hold a session here and run its turns (a task of the process)."""
    finish_op: Callable[[Drive], Awaitable[None]]
    """End a person's operation: release the session, or run what was queued meanwhile."""
    infra_failed: Callable[[], None]
    """A turn met a service or the bus unavailable: look before starting the next turn."""
    usage_seen: Callable[[dict[str, Any]], Awaitable[None]]
    """Pass one model request's usage (a ``usage`` event's fields) on to the gateways' metrics."""
    services_missing: Callable[[], Awaitable[str | None]]
    """What a turn needs that does not answer now (the bus, guard, versions, the judge), or None."""
