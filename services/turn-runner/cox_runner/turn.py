"""A running turn's identity and the signals other processes send it.

The runner that holds a session's lease keeps one :class:`Turn`. Admission on any runner
changes Redis first and then rings this runner's doorbell (``cox.ctl.<runner_id>``); the lease
keeper also learns the same flags from every renewal, so a lost doorbell only delays a signal by
one renewal period, it never loses it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
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
TAKEN_KEPT = 64
"""How many taken Leads a drive remembers (a late doorbell comes within moments of its take)."""


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
    stop_reason: str | None = None
    _guarding: dict[asyncio.Task[Any], int] = field(default_factory=dict, repr=False)
    """The tasks awaiting under :func:`guarded` (how deeply): Stop and steer cancel each once."""
    _stopped: set[asyncio.Task[Any]] = field(default_factory=set, repr=False)
    """Guarded tasks cancelled by a stop whose guard has not yet turned it into ``StopRequested``."""
    leads_waiting: bool = False
    leads_taken: deque[str] = field(default_factory=lambda: deque(maxlen=TAKEN_KEPT))
    """The Leads taken by the drive's turns, newest last (the drive's own, shared by its turns): a
    doorbell or a renewal for one of them came late, after the take, and is no Lead waiting."""
    observed_waiting: bool = True
    """Whether the operator's observations may wait for the next result (read then, in the call
    that records it): True until something says none do (:func:`cox_runner.drive.observed_at_start`)."""
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
        self.bell.set()
        try:
            me = asyncio.current_task()
        except RuntimeError:  # no loop running (a test's own call)
            me = None
        for task in self._guarding:
            # The running task itself (a stop asked from inside its own guarded await) is not
            # cancelled: its cancellation would land at whatever it awaits next, maybe outside
            # the guard; it sees ``stopping`` at its next look instead.
            if task is not me and task not in self._stopped:
                self._stopped.add(task)
                task.cancel()

    def lead_rang(self, lead_id: str | None) -> None:
        """A doorbell or a renewal says a Lead waits (``lead_id``: the newest, when it says which).
        Not when that Lead was taken already: a Lead saved while a record was on its way is taken
        as the record's reply says it waits, and its doorbell may come after. Taken as waiting, it
        would make the next boundary skip the model's calls for nothing."""
        if lead_id and lead_id in self.leads_taken:
            return
        self.leads_waiting = True
        self.ring()

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
    """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested.

    ``aw`` runs in the caller's own task: a stop cancels that task (:meth:`Turn.request_stop`), and
    the cancellation it caused, once ``aw`` has let it through (its cleanup ran), becomes
    ``StopRequested`` here and leaves nothing on the task (the ``uncancel`` of ``asyncio.timeout``'s
    own protocol). A cancellation from anywhere else stays a cancellation. Racing ``aw`` in a task
    of its own against a waiter on the stop, as this did before, cost two tasks, an
    ``asyncio.wait`` and two more passes of the event loop for every model request (#23)."""
    if turn.stopping:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise StopRequested(turn.stop_reason or "stop")
    task = asyncio.current_task()
    assert task is not None, "guarded runs in a task"
    guarding = turn._guarding
    guarding[task] = guarding.get(task, 0) + 1
    before = task.cancelling()  # cancellations already asked of the task are not the stop's
    try:
        result = await aw
    except BaseException as exc:
        if task not in turn._stopped:
            raise
        # The stop's cancellation reached ``aw`` (it is always delivered where the task waits),
        # whatever ``aw`` made of it (a library may raise its own error instead): it is taken off
        # the task here, or the drive's next turn would meet a cancellation nobody asked for.
        turn._stopped.discard(task)
        if task.uncancel() > before and isinstance(exc, asyncio.CancelledError):
            raise  # a cancellation from outside came as well (the lease lost, shutdown): it wins
        raise StopRequested(turn.stop_reason or "stop") from None
    finally:
        depth = guarding[task] - 1
        if depth:
            guarding[task] = depth
        else:
            del guarding[task]
    if task in turn._stopped:
        # ``aw`` caught the cancellation and answered anyway: the turn still stops here.
        turn._stopped.discard(task)
        task.uncancel()
        raise StopRequested(turn.stop_reason or "stop")
    return result


def stopped_by(reason: str | None) -> str:
    if reason == "steer":
        return "the person steered"
    if reason == "shutdown":
        return "the runner shut down and cancelled"
    return "the person stopped"
