"""A running turn's identity and the signals other processes send it.

The runner that holds a session's lease keeps one :class:`Turn`. Admission on any runner
changes Redis first and then rings this runner's doorbell (``cox.ctl.<runner_id>``); the lease
keeper also learns the same flags from every renewal, so a lost doorbell only delays a signal by
one renewal period, it never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .errors import StopRequested

T = TypeVar("T")

STOP_OUTCOME = {"stop": "stopped", "steer": "stopped", "shutdown": "canceled"}
SKIP_FOR_OUTCOME = {"output_limit": "truncated", "hard_budget": "limit", "spend_limit": "limit", "stuck": "limit",
                    "canceled": "canceled", "error": "error", "unavailable": "unavailable",
                    "context_full": "limit"}
"""The ``tool.skipped`` reason for calls a turn never started, by how the turn ended."""


@dataclass
class Ending:
    """How a turn ended (its ``turn.end``)."""

    outcome: str
    finish_reason: str | None = None
    detail: str | None = None
    provider_finish_reason: str | None = None
    pause: str = ""
    """A daily budget the turn reached (:meth:`cox_runner.spending.Reached.pause`): its end pauses
    the session."""


class EndTurn(Exception):
    """Raised anywhere in a turn to end it with ``ending`` (its open calls are closed on the way)."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.outcome)
        self.ending = ending


@dataclass
class Turn:
    sid: str
    turn_id: str
    token: str
    message_id: str
    text: str
    via: str
    workspace: Path
    model: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    """The message's attachment records (as its ``user.msg`` carries them)."""
    fresh: bool = False
    """The call that began this turn made the session (``cox_run``): the log holds nothing the
    transcript needs but this message, so the turn does not read it."""
    started: float = field(default_factory=time.monotonic)
    bell: asyncio.Event = field(default_factory=asyncio.Event)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str | None = None
    leads_waiting: bool = False
    observed_waiting: bool = False
    policy_inputs: tuple[frozenset[str], bool] | None = None
    """The session's standing approvals and don't-ask switch, cached for this turn's calls;
    dropped by every doorbell and by a renewal that sees the switch changed."""
    """Hint from a doorbell or renewal; the loop reads Redis at every boundary regardless."""
    """Hint only: every tool result takes the waiting observations from Redis."""
    turn_standing: set[str] = field(default_factory=set)
    info: dict[str, Any] = field(default_factory=dict)
    mcp: Any = None
    """The drive's MCP servers (:class:`cox_runner.workspace.mcp_servers.McpServers`), or None."""

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None or reason == "stop":
            self.stop_reason = reason
        self.stop_event.set()
        self.bell.set()

    def ring(self) -> None:
        self.policy_inputs = None
        self.bell.set()

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None

    @property
    def skip_reason(self) -> str:
        return "steer" if self.stop_reason == "steer" else "stop"


async def guarded(turn: Turn, aw: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
    """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested."""
    if turn.stopping:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise StopRequested(turn.stop_reason or "stop")
    task: asyncio.Future[T] = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(turn.stop_event.wait())
    try:
        racing: list[asyncio.Future[Any]] = [task, stopper]
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        stopper.cancel()
        raise
    stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise StopRequested(turn.stop_reason or "stop")


def stopped_by(reason: str | None) -> str:
    if reason == "steer":
        return "the person steered"
    if reason == "shutdown":
        return "the runner shut down and cancelled"
    return "the person stopped"
