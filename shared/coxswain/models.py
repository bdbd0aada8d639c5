"""One pydantic model per request and per result: HTTP bodies, session objects, RPC messages.

HTTP bodies forbid unknown fields so a typo is a 422, not a silently ignored option.
Text that will be stored or forwarded must be encodable UTF-8 (a JSON ``\\ud800`` escape
decodes to a lone surrogate, which would fail later as a 500): :data:`Text` rejects it early.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .events import Actor, RunConfirm, RunOutcome, Verdict
from .ids import ID_RE


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from exc
    if "\x00" in value:
        raise ValueError("text must not contain NUL")
    return value


Text = Annotated[str, AfterValidator(_utf8), Field(json_schema_extra={"pattern": "^[^\\u0000]*$"})]
"""(The pattern only tells the JSON Schema, so the gateway's OpenAPI document, that NUL is refused.)"""
Id = Annotated[str, Field(pattern=ID_RE.pattern)]
Mode = Literal["queue", "steer"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- HTTP bodies


class CreateSession(_Body):
    workspace: Annotated[Text, Field(min_length=1, max_length=4096)]
    model: Annotated[Text, Field(min_length=1, max_length=200)] | None = None
    title: Annotated[Text, Field(max_length=200)] | None = None
    create: bool = True
    """False: a workspace that does not exist under the root is 404 ``not_found`` instead of created."""


class PatchSession(_Body):
    title: Annotated[Text, Field(min_length=1, max_length=200)] | None = None
    auto_title: bool | None = None
    model: Annotated[Text, Field(min_length=1, max_length=200)] | None = None
    dont_ask: bool | None = None
    spend_limit: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)] | None = None
    """An admin's daily budget of this session in USD (in place of ``[limits] session_spend``);
    ``null`` clears it (the configured one applies again). Raising it resumes a paused session."""


class SendMessage(_Body):
    text: Annotated[Text, Field(min_length=1)]
    mode: Mode | None = None
    client_id: Id | None = None
    attachments: Annotated[list[Id], Field(max_length=32)] = Field(default_factory=list)
    """Attachment ids from ``POST /v1/sessions/{sid}/attachments``, sent with the message."""


class LeadMessage(_Body):
    text: Annotated[Text, Field(min_length=1)]
    client_id: Id | None = None
    attachments: Annotated[list[Id], Field(max_length=32)] = Field(default_factory=list)
    """Accepted only empty: a Lead with an attachment is 409 ``lead_text_only``."""
    turn_id: Id | None = None
    """The turn the person is leading; a Lead for a turn that is no longer running is 409 ``no_turn``."""


class ApprovalAnswer(_Body):
    decision: Literal["allow", "deny"]
    scope: Literal["once", "turn", "session"] = "once"
    message: Text | None = None


class QueueOrder(_Body):
    """``PUT /v1/sessions/{sid}/queue/order``: every queued message, in the order they should run."""

    message_ids: Annotated[list[Id], Field(max_length=10_000)]


class ObserveBody(_Body):
    command: Annotated[Text, Field(min_length=1, max_length=8192)]
    background: bool = False
    """Start the command as one of the session's programs (``!&command``: ``program.started``,
    read by the model with ``read_program``) instead of waiting for its end."""


class CreateRun(_Body):
    """``POST /v1/runs``: a session whose turns the program drives (docs/api.md, "Runs")."""

    workspace: Annotated[Text, Field(min_length=1, max_length=4096)] | None = None
    """The folder to run in, as for ``POST /v1/sessions`` (exactly one of workspace and template)."""
    template: Annotated[Text, Field(min_length=1, max_length=4096)] | None = None
    """An existing workspace copied into a fresh one of the caller's (``<template>-run-<n>``)."""
    text: Annotated[Text, Field(min_length=1)]
    model: Annotated[Text, Field(min_length=1, max_length=200)] | None = None
    confirm: RunConfirm = "person"
    unattended: bool = False
    max_turns: Annotated[int, Field(ge=1, le=1000)] = 10
    create: bool | None = None
    """With ``workspace``: as for ``POST /v1/sessions`` (default true); with ``template`` only
    false is meaningful (the copy is always a new folder)."""
    client_id: Id | None = None
    """An idempotency key: a second ``POST /v1/runs`` of the same principal with the same
    ``client_id`` answers the run the first one made (200, ``replay: true``) and starts nothing."""


class CheckBody(_Body):
    """``POST /v1/sessions/{sid}/check``: a command run in the sandbox in the workspace."""

    command: Annotated[Text, Field(min_length=1, max_length=8192)]
    timeout_s: Annotated[float, Field(gt=0, le=540)] = 300.0
    """Seconds the command may run; past it the whole tree is killed (``exit_code`` null)."""


class CompactBody(_Body):
    """``POST /v1/sessions/{sid}/compact``: what the summary should keep in view (optional)."""

    focus: Annotated[Text, Field(max_length=8192)] | None = None


# ---------------------------------------------------------------- HTTP results


class QueueItem(_Out):
    message_id: str
    text: str
    mode: Mode


class LeadInfo(_Out):
    lead_id: str
    state: Literal["pending", "applied", "unapplied"]
    text: str = ""


class ApprovalInfo(_Out):
    approval_id: str
    call_id: str
    name: str
    args: Any = None
    security: bool = False
    reason: str = ""
    judge: dict[str, Any] | None = None
    turn_id: str | None = None
    answer_url: str | None = None
    """The approval's answer link (``approval.pending``'s ``answer_url``)."""


class Plan(_Out):
    steps: list[str]
    marks: list[int] = Field(default_factory=list)
    turn_id: str | None = None


class SandboxInfo(_Out):
    """Where this session's commands run: ``mode`` from ``[sandbox] mode``; ``network`` is
    ``off`` (no network), ``session`` (a person allowed it for this session's commands) or ``on``
    (``[sandbox] network = true``: every command has it)."""

    mode: Literal["bwrap", "none"]
    network: Literal["off", "session", "on"]


class ProgramInfo(_Out):
    """A program running in the session's sandbox (``start_program``, or a person's ``!&command``):
    its id, name and command, when it started, and the tail of what it wrote (at most
    :data:`PROGRAM_TAIL_CHARS`, refreshed about once a second by the runner that holds it)."""

    program_id: str
    name: str
    command: str
    network: bool = False
    pty: bool = False
    started: int = 0
    """Milliseconds since the epoch."""
    by: Literal["model", "person"] = "model"
    """Who started it: the model's ``start_program`` or a person's ``!&command``."""
    tail: str = ""


PROGRAM_TAIL_CHARS = 2000


class McpServerInfo(_Out):
    """One MCP tool server of the session (``[[mcp.servers]]``) and its state as the session's
    runner last saw it: ``idle`` (not running: servers start with the session's first turn on a
    runner and stop when the session goes idle), ``ready``, ``failed`` or ``exited``."""

    name: str
    state: Literal["idle", "ready", "failed", "exited"]
    tools: list[str] = Field(default_factory=list)
    error: str | None = None


class UsageTotals(_Out):
    """A session's running totals of its recorded ``usage`` events (tokens, USD)."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float = 0.0


class BudgetInfo(_Out):
    """The daily budget that pauses a session (docs/api.md, "Budgets")."""

    budget: Literal["session_spend", "principal_spend"]
    limit: float
    """USD per day."""
    spent: float
    """USD spent today when it paused (the principal's, across its sessions, for ``principal_spend``)."""
    detail: str = ""


class RunInfo(_Out):
    """A run's state in the session object (docs/api.md, "Runs")."""

    state: Literal["running", "ended"]
    confirm: RunConfirm
    unattended: bool
    max_turns: int
    turns: int = 0
    """Turns the run has begun so far (the first one included)."""
    outcome: RunOutcome | None = None
    """Once ended: ``completed``, ``stopped``, ``max_turns`` or the last turn's outcome."""


class ShareInfo(_Out):
    principal: str
    role: Literal["reader", "approver"]


class Session(_Out):
    id: str
    workspace: str
    model: str | None
    title: str | None
    title_source: Literal["auto", "manual"] | None
    auto_title: bool
    busy: bool
    turn_id: str | None
    queue: list[QueueItem]
    leads: list[LeadInfo]
    approvals: list[ApprovalInfo]
    plan: Plan | None
    dont_ask: bool
    standing: list[str] = Field(default_factory=list)
    """Standing approvals ("always this session"): command prefixes, ``write:<path>``, ``network``."""
    sandbox: SandboxInfo | None = None
    mcp_servers: list[McpServerInfo] = Field(default_factory=list)
    """The session's MCP tool servers and their state (``[[mcp.servers]]``)."""
    programs: list[ProgramInfo] = Field(default_factory=list)
    """The programs running in the session's sandbox now (docs/api.md, "Programs")."""
    usage: UsageTotals = Field(default_factory=UsageTotals)
    """Running totals of the session's model requests (the sum of its ``usage`` events)."""
    spend_today: float = 0.0
    """USD the session's model requests cost today (UTC), against its daily budget."""
    spend_limit: float | None = None
    """An admin's daily budget of this session (PATCH ``spend_limit``); None: ``[limits] session_spend``."""
    budget_reached: BudgetInfo | None = None
    """The daily budget that pauses the session today (sends are 409 ``budget_reached``), or None."""
    created: int = 0
    next_model: str | None = None
    run: RunInfo | None = None
    """None for a chat; a run's state for a session made by ``POST /v1/runs``."""
    last_seq: int = 0
    """The seq of the session's latest recorded event. Events are published to the log just
    after they are recorded, so a reader that saw this state reads the log until it reaches
    this seq to see the events that led to it."""
    shares: list[ShareInfo] = Field(default_factory=list)
    """Who else may see it (``reader``) or also answer its approvals and Stop it (``approver``)."""
    access: Literal["owner", "admin", "reader", "approver"] | None = None
    """The caller's access: ``owner``, ``admin`` (an admin's view of another's session), or the
    role it was shared with the caller as (a session shared with the caller is marked so)."""


class Attachment(_Out):
    """``POST /v1/sessions/{sid}/attachments``: the file kept, to be named by a message."""

    attachment_id: str
    name: str
    media_type: str
    size: int


class SendResult(_Out):
    message_id: str
    disposition: Literal["started", "queued", "steered"]
    position: int | None = None


class LeadResult(_Out):
    lead_id: str
    pending: int
    turn_id: str | None = None
    """The turn the Lead joined."""


class StopResult(_Out):
    turn_id: str | None
    discarded: list[str]
    unapplied_leads: list[str]


class Accepted(_Out):
    ok: bool = True


class RunCreated(_Out):
    """``POST /v1/runs`` answered 201: the run's session, its workspace and its run state."""

    session_id: str
    workspace: str
    run: RunInfo
    replay: bool = False
    """True when ``client_id`` named a run already made: this is that run, as it is now (200)."""


class RunsResult(_Out):
    """``GET /v1/runs``: the caller's runs (session objects whose ``run`` is set), newest first."""

    runs: list[Session]


class CheckResult(_Out):
    """What a check command did: exit code 0 is a pass (None: it could not run, or timed out)."""

    exit_code: int | None
    output: str


# ---------------------------------------------------------------- RPC: gateway -> turn-runner
# Every command names the principal the gateway authenticated; the runner checks ownership again.


class SessionRef(_Body):
    principal: Id
    sid: Id


class HomeCmd(SessionRef):
    """A command of a :attr:`coxswain.rpc.Op.home` operation: the gateway sends it to the
    session's home runner and, when that home is late, to any runner too (:func:`coxswain.bus.call_home`)."""

    tx: Annotated[str, Field(pattern=r"^x_[A-Za-z0-9_-]{1,62}$")] | None = None
    """The request's transition id, one per request (the gateway's): whichever runner runs the
    request's change first makes it; the other's answers the same reply and does nothing more
    (redis_lib.lua, "A transition id may name its caller"). None: the runner's own, as for any call."""


class CreateCmd(_Body):
    principal: Id
    workspace: str
    model: str | None = None
    title: str | None = None
    create: bool = True


class RunCmd(CreateRun):
    principal: Id
    traceparent: Annotated[str, Field(max_length=55)] | None = None
    """The request's W3C ``traceparent`` header, checked by the gateway: each turn of the run is
    recorded as a child of it (its ``user.msg`` carries it)."""


class CheckCmd(SessionRef, CheckBody):
    pass


class ShareBody(_Body):
    """``POST /v1/sessions/{sid}/shares``."""

    principal: Id
    role: Literal["reader", "approver"]


class PatchCmd(SessionRef, PatchSession):
    spend_limit_set: bool = False
    """The body named ``spend_limit`` (``null`` in it clears the session's own budget)."""
    share: ShareBody | None = None
    """Set (or change) a share; not part of PATCH's body (the shares routes send it)."""
    unshare: Id | None = None
    """Remove the share of this principal (404 when it has none)."""


class SendCmd(HomeCmd, SendMessage):
    traceparent: Annotated[str, Field(max_length=55)] | None = None
    """The request's W3C ``traceparent`` header, checked by the gateway: the turn the message
    starts is recorded as a child of it (``user.msg`` carries it; docs/operations.md, Traces)."""


class AttachCmd(SessionRef):
    """The gateway kept an upload's bytes (content-addressed, by ``sha256``); record it."""

    attachment_id: Id
    name: Annotated[Text, Field(min_length=1, max_length=255)]
    media_type: Annotated[str, Field(min_length=3, max_length=255)]
    size: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class LeadCmd(HomeCmd, LeadMessage):
    pass


class StopBody(_Body):
    """``POST /v1/sessions/{sid}/stop``'s optional body."""

    programs: bool = False
    """Stop the session's running programs too (``program.stopped`` by ``stop``); without it
    they run on."""


class StopCmd(HomeCmd, StopBody):
    pass


class ApprovalCmd(HomeCmd, ApprovalAnswer):
    approval_id: Id


class QueueRemoveCmd(SessionRef):
    message_id: Id


class QueueOrderCmd(SessionRef, QueueOrder):
    pass


class QueueResult(_Out):
    """The queue after a removal or a reorder: the waiting message ids, in order."""

    queue: list[str]
    removed: str | None = None
    changed: bool = True


class WorkspacesCmd(_Body):
    principal: Id


class WorkspacesResult(_Out):
    """The folders directly under the root a session may use (hidden and denylisted ones left out)."""

    root: str
    workspaces: list[str]


class ObserveCmd(SessionRef, ObserveBody):
    pass


class ProgramStopCmd(SessionRef):
    """``POST /v1/sessions/{sid}/programs/{program_id}/stop``: a person stops one program."""

    program_id: Id


class RestoreCmd(SessionRef):
    version_id: Id


class UndoCmd(SessionRef):
    pass


class CompactCmd(SessionRef, CompactBody):
    pass


class CompactResult(_Out):
    """What a person's compaction did (``compacted`` false: nothing to compact, no event)."""

    compacted: bool
    before_tokens: int = 0
    after_tokens: int = 0
    summary: str = ""
    through_seq: int = 0
    dropped: int = 0


# ---------------------------------------------------------------- RPC: guard


class CallSpec(_Body):
    call_id: str
    name: str
    args: dict[str, Any]


ATTACHMENT_CALL = "attachment"
"""The name of guard's check of an attachment's content before a turn gives it to the model (not
a tool the model has): args ``{attachment_id, name, media_type, content}``; it answers ``ask``
(a security confirm, the person's) when the content looks like a credential, else ``allow``."""

STANDING_NETWORK = "network"
"""The standing approval a person's "always" on a network confirm records: the session's
commands may ask for the network without asking again."""


class GuardRequest(_Body):
    sid: Id
    workspace: str
    call: CallSpec
    dont_ask: bool = False
    standing: list[str] = Field(default_factory=list)
    """Command prefixes a person allowed for this session ("always")."""
    tainted: list[str] = Field(default_factory=list)
    """Fragments the turn read from tool results; a command that contains one is tainted."""
    trusted: list[str] = Field(default_factory=list)
    """The person's own words in this session (messages, Leads, approval messages): text found
    there is not taint even when a tool result also held it."""


class GuardResult(_Out):
    verdict: Verdict
    actor: Actor
    reason: str
    security: bool = False
    route: Literal["judge", "person"] | None = None
    """Where an ``ask`` goes next: the judge first, or straight to the person."""
    path: str | None = None
    """The call's path, relative to the workspace, after links were resolved."""
    preview: dict[str, Any] | None = None
    """For a write: what it would change (:func:`coxswain.textdiff.preview`), recorded with the
    decision so the Changes view can show it later."""


# ---------------------------------------------------------------- RPC: judge


class JudgeRequest(_Body):
    sid: Id
    workspace: str
    call: CallSpec
    task: str = ""
    plan: Plan | None = None
    sandboxed: bool = True
    """The command would run in the sandbox (workspace only, system read-only)."""
    network: bool = False
    """The command would run with the network (asked for by the call, or allowed by config)."""


class JudgeResult(_Out):
    verdict: Literal["allow", "refuse", "error"]
    """``allow`` only when the judge allowed and, for a model, its score reached the threshold."""
    score: float | None = None
    reason: str
    kind: str
    answer: str | None = None
    """What the judge itself answered (``allow``/``refuse``), before the threshold was applied."""
    threshold: float | None = None
    said: str | None = None
    """For a malformed or refused answer: what the model said, shown to the person."""
    usage: dict[str, Any] | None = None
    """The model judge's request: ``model``, input/output/cache tokens and ``cost`` (USD), recorded
    by the runner as a ``usage`` event with purpose ``judge``."""


# ---------------------------------------------------------------- RPC: versions


class KeepRequest(_Body):
    sid: Id
    workspace: str
    path: str
    token: int | None = None
    reason: Literal["write", "restore", "undo", "command"] = "write"
    turn_id: str | None = None
    call_id: str | None = None
    again: bool = False
    """A repeat of a keep whose answer was lost (the bus failed under it): the record already
    kept for this ``call_id`` and path, if any, is the answer (one version per write)."""


class KeepResult(_Out):
    version_id: str
    store: Literal["git", "versions", "absent"]
    path: str
    existed: bool


class VersionInfo(_Out):
    version_id: str
    path: str
    store: Literal["git", "versions", "absent"]
    size: int
    created: float
    reason: str
    sid: str
    undone: bool = False
    turn_id: str | None = None
    call_id: str | None = None


class ListVersionsRequest(_Body):
    sid: Id
    workspace: str
    path: str


class ListVersionsResult(_Out):
    path: str
    versions: list[VersionInfo]


class CollectRequest(_Body):
    """Collect the versions store and the shadow by the retention policy (``[versions]``)."""

    workspace: str | None = None
    """One workspace; none: every workspace folder under the root."""


class CollectResult(_Out):
    workspaces: int
    versions_kept: int
    versions_removed: int
    objects_removed: int
    bytes_freed: int
    """Bytes of versions-store objects removed (the shadow's are counted in ``shadow_objects_removed``)."""
    shadow_indexes_removed: int
    shadow_objects_removed: int
    ms: float
    failed: list[str] = Field(default_factory=list)
    """Workspaces skipped (``name: reason``) when collecting them all; one named fails the request."""


class DiffRequest(_Body):
    sid: Id
    workspace: str
    version_id: Id


class DiffResult(_Out):
    path: str
    version_id: str
    diff: str
    added: int
    removed: int
    deleted: bool = False
    empty: bool = False
    oversized: bool = False
    binary: bool = False
    hunks: list[dict[str, Any]] = Field(default_factory=list)
    """Numbered lines: ``{old_start, old_len, new_start, new_len, lines: [{op, old, new, text}]}``."""
    store: Literal["git", "versions", "absent"] | None = None


class RestoreRequest(_Body):
    sid: Id
    workspace: str
    version_id: Id
    token: int | None = None


class UndoRequest(_Body):
    sid: Id
    workspace: str
    token: int | None = None


class UndoFile(_Out):
    """One file undo would put back: to the content kept as ``version_id`` (``existed`` false: the
    file did not exist before that write, so undo deletes it)."""

    path: str
    version_id: str
    reason: str
    created: float
    existed: bool
    turn_id: str | None = None
    call_id: str | None = None


class UndoTarget(_Out):
    """What ``POST /undo`` would do now; empty when the session has no write left to undo."""

    files: list[UndoFile]


class FileOutcome(_Out):
    path: str
    kept: KeepResult
    restored_from: str
    added: int
    removed: int
    deleted: bool = False


class WriteOutcome(_Out):
    """What a restore or undo did: the version it kept first, then the write.

    Undoing a command puts back every file it changed: ``files`` lists each (the first is the
    one the top-level fields describe).
    """

    path: str
    kept: KeepResult
    restored_from: str
    added: int
    removed: int
    deleted: bool = False
    files: list[FileOutcome] = Field(default_factory=list)


class ChangesRequest(_Body):
    sid: Id
    workspace: str


PREVIEW_LABEL = "Approved preview — not proof of a successful write"
WRITTEN_LABEL = "Recorded write — diff: the version kept before it → the file now"
PREVIEW_UNAVAILABLE = "preview unavailable"


class ChangeEntry(_Out):
    """The latest approved write of one file, as the approval recorded it (not as it happened)."""

    path: str
    call_id: str
    turn_id: str | None = None
    seq: int
    ts: int = 0
    actor: str
    label: str = PREVIEW_LABEL
    available: bool
    preview: dict[str, Any] | None = None
    note: str | None = None
    """``"preview unavailable"`` for a record without detail; nothing is invented in its place."""
    via: Literal["tool", "command", "restore", "undo", "rewind"] = "tool"
    """``tool``: an approved ``write_file`` (its preview). Otherwise a write recorded by
    ``file.written`` (a command, a restore, an undo): no preview exists, ``version_id`` names the
    content kept before it, and its diff is that version → the file now (``/versions/{vid}/diff``)."""
    version_id: str | None = None
    added: int | None = None
    removed: int | None = None
    deleted: bool = False


class ChangesResult(_Out):
    files: list[ChangeEntry]


class SnapshotRequest(_Body):
    """Before a command: remember the workspace so what the command changes can be kept."""

    sid: Id
    workspace: str
    token: int | None = None


class SnapshotResult(_Out):
    snapshot: str | None
    """A tree id of the shadow repository; None when the snapshot was skipped (``skipped`` says why)."""
    skipped: str | None = None
    ms: float = 0.0


class CommandChangesRequest(_Body):
    """After a command: keep the previous content of every file it changed, created or deleted."""

    sid: Id
    workspace: str
    snapshot: Annotated[str, Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]
    token: int | None = None
    turn_id: str | None = None
    call_id: str | None = None


class FileChange(_Out):
    path: str
    version_id: str
    store: Literal["git", "versions", "absent"]
    added: int
    removed: int
    created: bool = False
    deleted: bool = False


MAX_SKIPPED = 50


class CommandChangesResult(_Out):
    changes: list[FileChange]
    skipped: list[str] = Field(default_factory=list)
    """Paths the command changed that are not kept (links, the denylist, too large), with why
    (at most :data:`MAX_SKIPPED` entries, the last one a count of the rest)."""
    limit: Literal["workspace_files", "workspace_mb"] | None = None
    """The ``[sandbox]`` bound that stopped the versioning of this command's changes."""
    not_kept: int = 0
    """How many changed files have no version kept (past the bound, too large, ...)."""
    note: str = ""
    """One line for the command's result when something was not kept because of a bound."""
    at_file_limit: list[str] = Field(default_factory=list)
    """Files the command left exactly ``[sandbox] file_mb`` large: RLIMIT_FSIZE stopped them."""


class Health(_Out):
    service: str
    ok: bool
    detail: dict[str, Any] = Field(default_factory=dict)


__all__ = [name for name in dir() if not name.startswith("_")] + ["Actor", "Verdict"]


# ---------------------------------------------------------------- fork and rewind


class ForkBody(_Body):
    at_turn: Annotated[int, Field(ge=1)]
    """The turn (from 1, in the order turns started) whose end the fork starts from."""


class RewindBody(_Body):
    to_turn: Annotated[int, Field(ge=1)]
    scope: Literal["conversation", "files", "both"]


class ForkCmd(SessionRef, ForkBody):
    pass


class RewindCmd(SessionRef, RewindBody):
    pass


class RewindResult(_Out):
    """What a rewind did: the ``session.rewound`` event's fields and the files put back."""

    to_turn: int
    scope: str
    through_seq: int
    restored_files: list[str] = Field(default_factory=list)
    files: list[FileOutcome] = Field(default_factory=list)


class ForkFilesRequest(_Body):
    """Copy ``workspace`` into the new folder ``target`` as it was when the session's writes
    ``known`` (every version kept by a write the log recorded up to the fork point) were the
    latest: the session's later writes are put back from their kept versions."""

    sid: Id
    workspace: str
    target: str
    known: list[str] = Field(default_factory=list)
    later: list[str] = Field(default_factory=list)
    """The versions the log recorded after the fork point (each must still be kept)."""


class ForkFilesResult(_Out):
    copied: int
    """Files copied (the store folder left out)."""
    restored_files: list[str] = Field(default_factory=list)
    """Files put back to their content at the fork point (deleted when they did not exist then)."""


class RewindFilesRequest(_Body):
    """Put the session's files back to what they were when the writes ``known`` were the
    latest; each put back is kept first (reason ``rewind``, ``call_id`` = ``rewind_id``)."""

    sid: Id
    workspace: str
    token: int | None = None
    known: list[str] = Field(default_factory=list)
    later: list[str] = Field(default_factory=list)
    rewind_id: Id


class RewindFilesResult(_Out):
    files: list[FileOutcome] = Field(default_factory=list)
