"""Every NATS request-reply operation, typed: who serves it, its request and reply, its time-out
and who may call it.

This table is the one place an operation is described. Both ends use it:

- a server registers its handlers from it (:meth:`coxswain.service.Service.serve`), typed so a
  handler taking or returning the wrong model is a mypy error, and a service that starts without
  serving every operation of its own in the table (or serves one that is not there) fails at start;
- a caller calls through it (:func:`call`), which takes the subject, the reply model and the
  time-out from the operation: there is no time-out at a call site;
- :mod:`coxswain.access` gives each service's NATS user the right to publish exactly the requests
  whose ``callers`` name it, so a new call is refused by nobody's forgotten permission list.

Health (``cox.rpc.<service>.health``) is served by every service (:class:`coxswain.service.Service`
registers it itself); it takes no request body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from nats.aio.client import Client
from pydantic import BaseModel, ConfigDict

from . import bus, subjects
from .ids import new_id
from .models import (
    Accepted,
    ApprovalCmd,
    AttachCmd,
    Attachment,
    ChangesRequest,
    ChangesResult,
    CheckCmd,
    CheckResult,
    CollectRequest,
    CollectResult,
    CommandChangesRequest,
    CommandChangesResult,
    CompactCmd,
    CompactResult,
    CreateCmd,
    DiffRequest,
    DiffResult,
    ForkCmd,
    ForkFilesRequest,
    ForkFilesResult,
    GuardRequest,
    GuardResult,
    Health,
    HomeCmd,
    JudgeRequest,
    JudgeResult,
    KeepRequest,
    KeepResult,
    LeadCmd,
    LeadResult,
    ListVersionsRequest,
    ListVersionsResult,
    ObserveCmd,
    PatchCmd,
    ProgramStopCmd,
    QueueOrderCmd,
    QueueRemoveCmd,
    QueueResult,
    RestoreCmd,
    RestoreRequest,
    RewindCmd,
    RewindFilesRequest,
    RewindFilesResult,
    RewindResult,
    RunCmd,
    RunCreated,
    SendCmd,
    SendResult,
    Session,
    SnapshotRequest,
    SnapshotResult,
    StopCmd,
    StopResult,
    UndoCmd,
    UndoRequest,
    UndoTarget,
    WorkspacesCmd,
    WorkspacesResult,
    WriteOutcome,
)
from .subjects import GATEWAY, GUARD, JUDGE, RUNNER, SERVICES, VERSIONS

if TYPE_CHECKING:
    from .config import Settings

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


class NoRequest(BaseModel):
    """The body of a request that carries nothing (health): sent as ``{}``, never parsed."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class Op(Generic[Req, Rep]):
    """One request-reply operation: ``cox.rpc.<service>.<name>``."""

    service: str
    name: str
    request: type[Req]
    reply: type[Rep]
    timeout: float | Callable[[Settings], float]
    """Seconds a caller waits for the reply; a function of the settings when they decide it."""
    callers: tuple[str, ...]
    """The services that may send it (their NATS users may publish its subject)."""
    home: bool = False
    """A session's operation that its home runner answers best: the runner where the session's
    turns run, which holds the transcript it kept and the drive it rings. Each replica also
    answers it on a subject of its own (:meth:`subject_at`), and its reply says where the
    session's turns run now (``home``, :func:`coxswain.bus.set_home`); a caller that remembers it
    sends the session's next such request there (:func:`call_home`). Any replica answers it
    correctly: the home is a saving, never a condition."""

    @property
    def subject(self) -> str:
        return subjects.rpc(self.service, self.name)

    def subject_at(self, instance: str) -> str:
        """This operation on one replica (no queue group): ``cox.rpc.<service>.<op>.<instance>``."""
        return subjects.rpc_at(self.service, self.name, instance)

    def timeout_s(self, settings: Settings | None = None) -> float:
        if callable(self.timeout):
            if settings is None:
                raise ValueError(f"{self.subject}'s time-out depends on the settings: pass them")
            return self.timeout(settings)
        return self.timeout


async def call(nc: Client, op: Op[Req, Rep], request: Req, *, settings: Settings | None = None) -> Rep:
    """Send ``request`` to ``op`` and parse its reply (or raise its error; :mod:`coxswain.bus`)."""
    return await bus.call(nc, op.subject, request, op.reply, timeout=op.timeout_s(settings))


async def call_home(nc: Client, op: Op[Req, Rep], request: Req, home: str | None) -> tuple[Rep, str | None]:
    """Send ``request`` to a :attr:`Op.home` operation: to the replica ``home`` when given (and
    still listening; else to any), and parse its reply. The reply, and where the session's turns
    run now as the reply says (``None``: it did not say)."""
    if not op.home:
        raise ValueError(f"{op.subject} is not a session's operation sent to its home")
    if isinstance(request, HomeCmd) and request.tx is None:
        # one transition id per request: a late home's request is sent to any replica too, and
        # whichever runs it second answers the first one's reply (bus.call_home)
        request = request.model_copy(update={"tx": new_id("x")})
    return await bus.call_home(nc, op.subject, None if home is None else op.subject_at(home), request, op.reply,
                               timeout=op.timeout_s())


def _judge_timeout(settings: Settings) -> float:
    # The judge's own limit on its model, and a little more for the bus.
    return settings.judge.timeout_s + 5


# ---------------------------------------------------------------- gateway -> turn-runner
RUNNER_CREATE: Final = Op(RUNNER, "create", CreateCmd, Session, 30.0, (GATEWAY,))
RUNNER_PATCH: Final = Op(RUNNER, "patch", PatchCmd, Session, 30.0, (GATEWAY,))
RUNNER_SEND: Final = Op(RUNNER, "send", SendCmd, SendResult, 30.0, (GATEWAY,), home=True)
RUNNER_ATTACH: Final = Op(RUNNER, "attach", AttachCmd, Attachment, 30.0, (GATEWAY,))
RUNNER_LEAD: Final = Op(RUNNER, "lead", LeadCmd, LeadResult, 30.0, (GATEWAY,), home=True)
RUNNER_STOP: Final = Op(RUNNER, "stop", StopCmd, StopResult, 30.0, (GATEWAY,), home=True)
RUNNER_ANSWER: Final = Op(RUNNER, "answer", ApprovalCmd, Accepted, 30.0, (GATEWAY,), home=True)
RUNNER_OBSERVE: Final = Op(RUNNER, "observe", ObserveCmd, Accepted, 90.0, (GATEWAY,))
RUNNER_PROGRAM_STOP: Final = Op(RUNNER, "program_stop", ProgramStopCmd, Accepted, 30.0, (GATEWAY,))
RUNNER_RESTORE: Final = Op(RUNNER, "restore", RestoreCmd, WriteOutcome, 30.0, (GATEWAY,))
RUNNER_UNDO: Final = Op(RUNNER, "undo", UndoCmd, WriteOutcome, 30.0, (GATEWAY,))
RUNNER_COMPACT: Final = Op(RUNNER, "compact", CompactCmd, CompactResult, 330.0, (GATEWAY,))
"""A summary request to the model may take minutes."""
RUNNER_QUEUE_REMOVE: Final = Op(RUNNER, "queue_remove", QueueRemoveCmd, QueueResult, 30.0, (GATEWAY,))
RUNNER_QUEUE_ORDER: Final = Op(RUNNER, "queue_order", QueueOrderCmd, QueueResult, 30.0, (GATEWAY,))
RUNNER_WORKSPACES: Final = Op(RUNNER, "workspaces", WorkspacesCmd, WorkspacesResult, 30.0, (GATEWAY,))

# fork and rewind (docs/api.md): a fork copies a workspace, which may take a while
RUNNER_FORK: Final = Op(RUNNER, "fork", ForkCmd, Session, 330.0, (GATEWAY,))
RUNNER_REWIND: Final = Op(RUNNER, "rewind", RewindCmd, RewindResult, 60.0, (GATEWAY,))

# runs (docs/api.md, "Runs"): a template's copy may take a while; a check runs up to 540 s
RUNNER_RUN: Final = Op(RUNNER, "run", RunCmd, RunCreated, 330.0, (GATEWAY,))
RUNNER_CHECK: Final = Op(RUNNER, "check", CheckCmd, CheckResult, 600.0, (GATEWAY,))
"""Bounded by the check's own ``timeout_s`` (at most 540 s) and its versioning."""

# ---------------------------------------------------------------- turn-runner -> guard, judge
GUARD_CHECK: Final = Op(GUARD, "check", GuardRequest, GuardResult, 10.0, (RUNNER,))
JUDGE_DECIDE: Final = Op(JUDGE, "decide", JudgeRequest, JudgeResult, _judge_timeout, (RUNNER,))

# ---------------------------------------------------------------- versions
# Writes come from the runner (fenced by the session's token), reads from the gateway.
VERSIONS_KEEP: Final = Op(VERSIONS, "keep", KeepRequest, KeepResult, 30.0, (RUNNER,))
VERSIONS_RESTORE: Final = Op(VERSIONS, "restore", RestoreRequest, WriteOutcome, 30.0, (RUNNER,))
VERSIONS_UNDO: Final = Op(VERSIONS, "undo", UndoRequest, WriteOutcome, 30.0, (RUNNER,))
VERSIONS_SNAPSHOT: Final = Op(VERSIONS, "snapshot", SnapshotRequest, SnapshotResult, 90.0, (RUNNER,))
VERSIONS_AFTER: Final = Op(VERSIONS, "after", CommandChangesRequest, CommandChangesResult, 120.0, (RUNNER,))
VERSIONS_DIFF: Final = Op(VERSIONS, "diff", DiffRequest, DiffResult, 30.0, (GATEWAY, RUNNER))
VERSIONS_LIST: Final = Op(VERSIONS, "list", ListVersionsRequest, ListVersionsResult, 30.0, (GATEWAY,))
VERSIONS_CHANGES: Final = Op(VERSIONS, "changes", ChangesRequest, ChangesResult, 30.0, (GATEWAY,))
VERSIONS_UNDO_TARGET: Final = Op(VERSIONS, "undo_target", UndoRequest, UndoTarget, 30.0, (GATEWAY,))
VERSIONS_COLLECT: Final = Op(VERSIONS, "collect", CollectRequest, CollectResult, 600.0, ())
"""Retention on demand. No service sends it (so no service user may): an operator does, as the
NATS ``admin`` user (docs/operations.md#retention)."""
VERSIONS_FORK: Final = Op(VERSIONS, "fork", ForkFilesRequest, ForkFilesResult, 300.0, (RUNNER,))
VERSIONS_REWIND: Final = Op(VERSIONS, "rewind", RewindFilesRequest, RewindFilesResult, 30.0, (RUNNER,))

# ---------------------------------------------------------------- health, on every service
HEALTH_CALLERS: Final = {
    GATEWAY: (GATEWAY,),  # /healthz asks every service, itself included
    RUNNER: (GATEWAY,),
    # a runner asks what a turn needs before starting a queued turn after an outage
    GUARD: (GATEWAY, RUNNER),
    JUDGE: (GATEWAY, RUNNER),
    VERSIONS: (GATEWAY, RUNNER),
}
HEALTH: Final[dict[str, Op[NoRequest, Health]]] = {
    svc: Op(svc, "health", NoRequest, Health, 2.0, HEALTH_CALLERS[svc]) for svc in SERVICES
}

OPERATOR_OPS: Final[tuple[Op[Any, Any], ...]] = (VERSIONS_COLLECT,)
"""Operations only an operator sends (their ``callers`` is empty)."""

OPS: Final[tuple[Op[Any, Any], ...]] = (
    RUNNER_CREATE, RUNNER_PATCH, RUNNER_SEND, RUNNER_ATTACH, RUNNER_LEAD, RUNNER_STOP, RUNNER_ANSWER, RUNNER_OBSERVE,
    RUNNER_PROGRAM_STOP, RUNNER_RESTORE, RUNNER_UNDO, RUNNER_COMPACT, RUNNER_QUEUE_REMOVE, RUNNER_QUEUE_ORDER, RUNNER_WORKSPACES,
    GUARD_CHECK, JUDGE_DECIDE,
    VERSIONS_KEEP, VERSIONS_RESTORE, VERSIONS_UNDO, VERSIONS_SNAPSHOT, VERSIONS_AFTER, VERSIONS_DIFF,
    VERSIONS_LIST, VERSIONS_CHANGES, VERSIONS_UNDO_TARGET, VERSIONS_COLLECT,
    RUNNER_FORK, RUNNER_REWIND, VERSIONS_FORK, VERSIONS_REWIND, RUNNER_RUN, RUNNER_CHECK,
    *HEALTH.values(),
)
"""Every operation, health included."""


HOME_OPS: Final = tuple(op for op in OPS if op.home)
"""The operations sent to a session's home runner when the caller knows it (each takes a ``sid``)."""


def served_by(service: str) -> tuple[Op[Any, Any], ...]:
    """The operations ``service`` answers (health included)."""
    return tuple(op for op in OPS if op.service == service)


def called_by(service: str) -> tuple[Op[Any, Any], ...]:
    """The operations ``service`` may send."""
    return tuple(op for op in OPS if service in op.callers)
