"""Events: the append-only log of a session, one tagged union parsed by one TypeAdapter.

Every event carries ``seq`` (rising by one per session, never repeated) and ``ts`` (ms, Redis
clock). Both are assigned inside Redis when the event is recorded, atomically with the state
change it describes, so producers build events without them (see :func:`body`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Via = Literal["send", "queue", "steer", "lead", "approval"]
Outcome = Literal[
    "completed", "empty", "output_limit", "error", "stopped", "canceled",
    "hard_budget", "spend_limit", "stuck", "crashed",
]
UNFINISHED: frozenset[str] = frozenset({"error", "stopped", "hard_budget", "spend_limit", "canceled", "crashed"})
"""Outcomes whose plan is carried into the next turn (DESIGN: A turn, step 9)."""
SkipReason = Literal["lead", "approval", "steer", "stop", "truncated", "limit", "canceled", "error"]
"""Why a tool call never started. ``approval``: an approval answer carried a message (a newer
instruction); ``limit``: a hard limit ended the turn; ``canceled``/``error``: the turn ended so."""
Verdict = Literal["allow", "ask", "refuse"]
Actor = Literal["setting", "standing", "judge", "person", "policy", "dont_ask", "sandbox"]


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")

    seq: int = 0
    sid: str
    turn_id: str | None = None
    ts: int = 0


class SessionCreated(_Event):
    type: Literal["session.created"] = "session.created"
    workspace: str
    model: str | None
    title: str | None = None
    source: Literal["auto", "manual"] | None = None


class TitleSet(_Event):
    type: Literal["title.set"] = "title.set"
    title: str
    source: Literal["auto", "manual"]


class SessionUpdated(_Event):
    """A setting changed (model, dont_ask, auto_title); ``changes`` holds the new values."""

    type: Literal["session.updated"] = "session.updated"
    changes: dict[str, Any]


class UserMsg(_Event):
    type: Literal["user.msg"] = "user.msg"
    message_id: str
    text: str
    via: Via


class QueueAdded(_Event):
    type: Literal["queue.added"] = "queue.added"
    message_id: str
    position: int
    mode: Literal["queue", "steer"] = "queue"


class QueueDiscarded(_Event):
    type: Literal["queue.discarded"] = "queue.discarded"
    message_ids: list[str]


class TurnStart(_Event):
    type: Literal["turn.start"] = "turn.start"
    message_id: str
    model: str


class TurnEnd(_Event):
    type: Literal["turn.end"] = "turn.end"
    outcome: Outcome
    finish_reason: str | None = None
    detail: str | None = None
    provider_finish_reason: str | None = None
    """The finish reason exactly as the provider sent it (``finish_reason`` is normalised)."""


class AssistantDelta(_Event):
    type: Literal["assistant.delta"] = "assistant.delta"
    text: str


class ToolCallRef(BaseModel):
    call_id: str
    name: str
    args: Any


class AssistantMsg(_Event):
    """A complete model response. ``tool_calls`` lists the calls it asked for, in order."""

    type: Literal["assistant.msg"] = "assistant.msg"
    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    tool_calls: list[ToolCallRef] = Field(default_factory=list)
    provider_finish_reason: str | None = None


class ToolCall(_Event):
    type: Literal["tool.call"] = "tool.call"
    call_id: str
    name: str
    args: Any


class ToolResult(_Event):
    type: Literal["tool.result"] = "tool.result"
    call_id: str
    ok: bool
    output: str
    observed: list[dict[str, Any]] | None = None
    """Operator ``!command`` results ({command, output}) folded into this result for the model."""


class ToolSkipped(_Event):
    type: Literal["tool.skipped"] = "tool.skipped"
    call_id: str
    reason: SkipReason


class PolicyDecision(_Event):
    type: Literal["policy.decision"] = "policy.decision"
    call_id: str
    verdict: Verdict
    actor: Actor
    reason: str
    security: bool = False
    name: str | None = None
    path: str | None = None
    preview: dict[str, Any] | None = None
    """A write's preview (textdiff.preview) as guard computed it before the decision."""


class ApprovalPending(_Event):
    type: Literal["approval.pending"] = "approval.pending"
    approval_id: str
    call_id: str
    security: bool
    judge: dict[str, Any] | None = None
    name: str = ""
    args: Any = None
    reason: str = ""
    preview: dict[str, Any] | None = None


class ApprovalResolved(_Event):
    type: Literal["approval.resolved"] = "approval.resolved"
    approval_id: str
    decision: Literal["allow", "deny"]
    actor: Actor
    message: str | None = None
    scope: Literal["once", "turn", "session"] | None = None
    reason: str | None = None


class VersionKept(_Event):
    type: Literal["version.kept"] = "version.kept"
    path: str
    version_id: str
    store: Literal["git", "versions", "absent"]


class FileWritten(_Event):
    type: Literal["file.written"] = "file.written"
    path: str
    added: int
    removed: int
    via: Literal["tool", "restore", "undo", "command"] = "tool"
    deleted: bool = False


class LeadSaved(_Event):
    type: Literal["lead.saved"] = "lead.saved"
    lead_id: str
    text: str = ""


class LeadApplied(_Event):
    type: Literal["lead.applied"] = "lead.applied"
    lead_ids: list[str]


class LeadUnapplied(_Event):
    type: Literal["lead.unapplied"] = "lead.unapplied"
    lead_ids: list[str]


class AgentMessage(_Event):
    type: Literal["agent.message"] = "agent.message"
    text: str


class Observed(_Event):
    type: Literal["observed"] = "observed"
    command: str
    output: str
    exit_code: int | None = None


class PlanWrite(_Event):
    type: Literal["plan.write"] = "plan.write"
    steps: list[str]


class PlanStep(_Event):
    type: Literal["plan.step"] = "plan.step"
    step: int


class PlanCarried(_Event):
    type: Literal["plan.carried"] = "plan.carried"
    from_turn: str
    steps: list[str]
    marks: list[int]


class LimitSoft(_Event):
    type: Literal["limit.soft"] = "limit.soft"
    limit: str
    value: float


class LimitHard(_Event):
    type: Literal["limit.hard"] = "limit.hard"
    limit: str
    value: float


Event = Annotated[
    SessionCreated | TitleSet | SessionUpdated | UserMsg | QueueAdded | QueueDiscarded | TurnStart
    | TurnEnd | AssistantDelta | AssistantMsg | ToolCall | ToolResult | ToolSkipped | PolicyDecision
    | ApprovalPending | ApprovalResolved | VersionKept | FileWritten | LeadSaved | LeadApplied
    | LeadUnapplied | AgentMessage | Observed | PlanWrite | PlanStep | PlanCarried | LimitSoft | LimitHard,
    Field(discriminator="type"),
]
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_TYPES: frozenset[str] = frozenset(
    m.model_fields["type"].default for m in _Event.__subclasses__()
)


def body(event: _Event) -> str:
    """The JSON an event is recorded with: without ``seq`` and ``ts``, which Redis assigns."""
    return event.model_dump_json(exclude={"seq", "ts"})


def parse(raw: bytes | str) -> Event:
    return EVENT.validate_json(raw)
