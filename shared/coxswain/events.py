"""Events: the append-only log of a session, one tagged union parsed by one TypeAdapter.

Every event carries ``seq`` (rising by one per session, never repeated) and ``ts`` (ms, Redis
clock). Both are assigned inside Redis when the event is recorded, atomically with the state
change it describes, so producers build events without them (see :func:`body`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Via = Literal["send", "queue", "steer", "lead", "approval"]
Outcome = Literal[
    "completed", "empty", "output_limit", "error", "stopped", "canceled",
    "hard_budget", "spend_limit", "stuck", "crashed", "unavailable", "context_full",
]
"""``unavailable``: guard, the judge or versions (or the message bus) did not answer within
``[runner] infra_wait_s``; the detail names which. Not a tool outcome: the call was not run.
``context_full``: the transcript did not fit the model's context window even after compaction."""
UNFINISHED: frozenset[str] = frozenset({"error", "stopped", "hard_budget", "spend_limit", "canceled", "crashed",
                                        "unavailable", "context_full"})
"""Outcomes whose plan is carried into the next turn (docs/design.md, The turn loop: Plan)."""
SkipReason = Literal["lead", "approval", "steer", "stop", "truncated", "limit", "canceled", "error", "unavailable"]
"""Why a tool call never started. ``approval``: an approval answer carried a message (a newer
instruction); ``limit``: a hard limit ended the turn; ``canceled``/``error``/``unavailable``: the
turn ended so."""
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
    text: str = ""
    """What was queued, so the log alone tells a later reader (another tab, a reload) its fate."""


class QueueRemoved(_Event):
    """A person removed a queued message before it started (``DELETE /queue/{message_id}``)."""

    type: Literal["queue.removed"] = "queue.removed"
    message_id: str
    text: str = ""
    mode: Literal["queue", "steer"] = "queue"


class QueueReordered(_Event):
    """A person reordered the queue: ``message_ids`` is every queued message, in its new order."""

    type: Literal["queue.reordered"] = "queue.reordered"
    message_ids: list[str]


class QueueDiscarded(_Event):
    type: Literal["queue.discarded"] = "queue.discarded"
    message_ids: list[str]


class TurnStart(_Event):
    type: Literal["turn.start"] = "turn.start"
    message_id: str
    model: str
    agents_md: str | None = None
    """The sha256 of the workspace's ``AGENTS.md`` given to the model this turn (none: no such file)."""


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


class ContextCompacted(_Event):
    """The transcript the model sees was compacted (the log keeps everything). Events up to
    ``through_seq`` are replaced, for the model, by ``summary`` (the turn's original message and
    its Leads and approval messages stay verbatim); what follows is kept as it was. ``summary``
    empty: the summary failed and the ``dropped`` oldest tool outputs were replaced by a note."""

    type: Literal["context.compacted"] = "context.compacted"
    before_tokens: int
    after_tokens: int
    summary: str
    through_seq: int
    dropped: int = 0


class EventOmitted(_Event):
    """Stands in the log for an event too large for the stream (over :data:`MAX_EVENT_BYTES`):
    same seq, what it was and how large. Only a last resort: what a person sends is refused
    before it is accepted when it could not be recorded (``413``), and tool output is clipped."""

    type: Literal["event.omitted"] = "event.omitted"
    original_type: str
    bytes: int


class LimitWarning(_Event):
    """A hard limit's value reached ``[limits] warn_at`` of it (once per limit and turn)."""

    type: Literal["limit.warning"] = "limit.warning"
    limit: str
    value: float
    of: float
    """The hard limit's value."""


UsagePurpose = Literal["turn", "title", "judge", "compaction"]


class Usage(_Event):
    """What one model request used and cost (USD; 0 when unknown), and what it was for."""

    type: Literal["usage"] = "usage"
    purpose: UsagePurpose
    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float = 0.0


class ModelRetry(_Event):
    """A model request failed in a way worth retrying; the next try comes after ``delay_s``."""

    type: Literal["model.retry"] = "model.retry"
    attempt: int
    delay_s: float
    error: str


Event = Annotated[
    SessionCreated | TitleSet | SessionUpdated | UserMsg | QueueAdded | QueueRemoved | QueueReordered
    | QueueDiscarded | TurnStart
    | TurnEnd | AssistantDelta | AssistantMsg | ToolCall | ToolResult | ToolSkipped | PolicyDecision
    | ApprovalPending | ApprovalResolved | VersionKept | FileWritten | LeadSaved | LeadApplied
    | LeadUnapplied | AgentMessage | Observed | PlanWrite | PlanStep | PlanCarried | LimitSoft | LimitHard
    | EventOmitted | LimitWarning | Usage | ModelRetry | ContextCompacted,
    Field(discriminator="type"),
]
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_TYPES: frozenset[str] = frozenset(
    m.model_fields["type"].default for m in _Event.__subclasses__()
)


MAX_EVENT_BYTES = 1_048_576 - 2048
"""The largest event the log records: the stream's ``max_msg_size`` and NATS's ``max_payload``
(both 1 MiB) less room for the publish headers."""
MAX_TEXT_BYTES = MAX_EVENT_BYTES - 2048
"""The largest message text, counted as it is recorded (JSON-escaped, see :func:`recorded_size`):
a ``user.msg`` event around it stays under :data:`MAX_EVENT_BYTES`."""

_ESCAPED_2 = '"\\/\b\f\n\r\t'
_CONTROL = re.compile("[\x00-\x07\x0b\x0e-\x1f\x7f]")


def recorded_size(text: str) -> int:
    """Bytes ``text`` takes inside a recorded event: UTF-8, with JSON escaping as the Redis
    library's cjson writes it (``"``, ``\\``, ``/`` and the short control escapes take 2 bytes;
    other control characters and DEL 6). 600 KB of ``/`` is 1.2 MB recorded."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    size += sum(text.count(c) for c in _ESCAPED_2)
    return size + 5 * len(_CONTROL.findall(text))


def check_text(text: str, what: str = "a message") -> None:
    """Refuse (413) a text that could not be recorded in the log: before it is accepted."""
    from .errors import TooLarge

    size = recorded_size(text)
    if size > MAX_TEXT_BYTES:
        raise TooLarge(f"{what} may take {MAX_TEXT_BYTES} bytes as recorded (UTF-8, JSON-escaped: "
                       f"\" \\ / and control characters count twice or more); this one takes {size}")


def body(event: _Event) -> str:
    """The JSON an event is recorded with: without ``seq`` and ``ts``, which Redis assigns."""
    return event.model_dump_json(exclude={"seq", "ts"})


def parse(raw: bytes | str) -> Event:
    return EVENT.validate_json(raw)
