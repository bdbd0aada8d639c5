"""What ``cox acp`` tells an ACP client about a coxswain session: each event of its log
(docs/api.md, "Events") becomes zero or more ACP ``session/update``s, and a turn's outcome a
``stopReason``. Pure: no I/O, so tests/fast checks it without servers.

One :class:`Mapper` follows one session's log in seq order (a replay for ``session/load`` and the
live stream after it go through the same mapper, so both say the same thing)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    ConfigOptionUpdate,
    ContentToolCallContent,
    Cost,
    CurrentModeUpdate,
    FileEditToolCallContent,
    PlanEntry,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionInfoUpdate,
    SessionMode,
    SessionModeState,
    TextContentBlock,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
)

Event = dict[str, Any]
Update = Any

STOP_REASONS: dict[str, str] = {
    "completed": "end_turn",
    "output_limit": "max_tokens",
    "hard_budget": "max_turn_requests",
    "spend_limit": "max_turn_requests",
    "stopped": "cancelled",
}
"""``turn.end`` outcomes that answer a ``session/prompt`` with a ``stopReason``; any other
outcome answers it with a JSON-RPC error naming the outcome (:data:`TURN_FAILED`)."""

TURN_FAILED = -32010
"""The JSON-RPC error code of a prompt whose turn ended with an outcome ACP has no name for."""

ASK, DONT_ASK = "ask", "dont_ask"
MODES = SessionModeState(
    current_mode_id=ASK,
    available_modes=[
        SessionMode(id=ASK, name="Ask", description="calls the policy does not allow wait for your approval"),
        SessionMode(id=DONT_ASK, name="Don't ask",
                    description="the don't-ask switch: what would ask you is allowed (security confirms still ask)"),
    ],
)
MODEL_OPTION = "model"

KINDS = {
    "read_file": "read", "list_dir": "read", "find_files": "search", "search_text": "search",
    "write_file": "edit", "edit_file": "edit", "run_command": "execute",
    "plan_write": "think", "plan_step": "think", "respond": "other",
}
OUTPUT_CLIP = 8000
"""How much of a tool's output a ``tool_call_update`` carries (the model saw it whole)."""


def stop_reason(outcome: str) -> str | None:
    return STOP_REASONS.get(outcome)


def modes(dont_ask: bool) -> SessionModeState:
    return MODES.model_copy(update={"current_mode_id": DONT_ASK if dont_ask else ASK})


def model_option(current: str, models: list[str]) -> SessionConfigOptionSelect:
    names = list(dict.fromkeys([*models, current]))
    return SessionConfigOptionSelect(
        id=MODEL_OPTION, name="Model", type="select", category="model", current_value=current,
        description="the session's model (a change while a turn runs applies before the next one)",
        options=[SessionConfigSelectOption(value=m, name=m) for m in names])


def text_of(block: Any) -> str:
    """A prompt content block as the text coxswain is sent (text as it is, a resource by its
    text or its link)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind == "resource_link":
        return f"@{block.uri}"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        return f"{res.uri}:\n{text}" if text is not None else f"@{res.uri}"
    raise ValueError(f"a {kind} content block is not supported (prompt capabilities: text, images, resources)")


def tool_kind(name: str, args: Any) -> str:
    if name == "run_command" and isinstance(args, dict) and args.get("network"):
        return "fetch"
    return KINDS.get(name, "other")


def tool_title(name: str, args: Any) -> str:
    a = args if isinstance(args, dict) else {}
    if name == "run_command":
        return f"`{a.get('command', '')}`"
    label = {"read_file": "Read", "list_dir": "List", "write_file": "Write", "edit_file": "Edit",
             "find_files": "Find", "search_text": "Search", "plan_write": "Plan", "plan_step": "Plan step",
             "respond": "Respond"}.get(name)
    what = a.get("path") or a.get("pattern") or a.get("step") or ""
    return f"{label} {what}".strip() if label else name


def text_content(text: str) -> ContentToolCallContent:
    return ContentToolCallContent(type="content", content=TextContentBlock(type="text", text=text))


def diff_from_preview(path: str, preview: dict[str, Any], args: Any) -> FileEditToolCallContent | None:
    """An edit's ACP ``diff`` from guard's preview of it (computed against the file as it was,
    the content the write keeps as a version): the hunks' old and new sides, or the whole new
    text of a created file."""
    a = args if isinstance(args, dict) else {}
    if preview.get("binary") or preview.get("oversized"):
        return None
    if preview.get("created") and isinstance(a.get("content"), str):
        return FileEditToolCallContent(type="diff", path=path, old_text=None, new_text=a["content"])
    old: list[str] = []
    new: list[str] = []
    for hunk in preview.get("hunks") or []:
        for line in hunk.get("lines") or []:
            op, text = line.get("op"), str(line.get("text", ""))
            if op in (" ", "-"):
                old.append(text)
            if op in (" ", "+"):
                new.append(text)
    if not old and not new:
        return None
    return FileEditToolCallContent(type="diff", path=path, old_text="\n".join(old), new_text="\n".join(new))


@dataclass
class Mapper:
    """Follows one session's log and says it in ACP updates. ``workspace`` is the session's
    folder (tool locations are absolute paths in it); ``own`` the message ids this client sent
    (their ``user.msg`` is not echoed back live: the client shows its own prompt)."""

    workspace: str
    context_size: int = 200_000
    own: set[str] = field(default_factory=set)
    calls: dict[str, tuple[str, Any]] = field(default_factory=dict)
    streamed: str = ""
    steps: list[str] = field(default_factory=list)
    marks: set[int] = field(default_factory=set)
    cost: float = 0.0
    models: list[str] = field(default_factory=list)

    def abs(self, path: str) -> str:
        return path if posixpath.isabs(path) else posixpath.normpath(posixpath.join(self.workspace, path))

    def locations(self, args: Any) -> list[ToolCallLocation] | None:
        if isinstance(args, dict) and isinstance(args.get("path"), str):
            return [ToolCallLocation(path=self.abs(args["path"]))]
        return None

    def plan(self) -> AgentPlanUpdate:
        entries = []
        first_open = True
        for i, step in enumerate(self.steps, 1):
            if i in self.marks:
                status = "completed"
            elif first_open:
                status, first_open = "in_progress", False
            else:
                status = "pending"
            entries.append(PlanEntry(content=step, priority="medium", status=status))
        return AgentPlanUpdate(session_update="plan", entries=entries)

    def updates(self, ev: Event, replay: bool = False) -> list[Update]:
        """The updates one event becomes (``replay``: a ``session/load`` replays the log, the
        person's own messages included)."""
        t = ev.get("type")
        if t == "assistant.delta":
            text = str(ev.get("text", ""))
            self.streamed += text
            return [chunk(text)] if text else []
        if t == "assistant.msg":
            text = str(ev.get("text", ""))
            streamed, self.streamed = self.streamed, ""
            if text and not streamed:  # a response whose text was not streamed (a fork's copy)
                return [chunk(text)]
            if text.startswith(streamed) and len(text) > len(streamed):
                return [chunk(text[len(streamed):])]
            return []
        if t == "agent.message":
            return [chunk(str(ev.get("text", "")))]
        if t == "user.msg":
            if not replay and ev.get("message_id") in self.own:
                return []
            text = str(ev.get("text", ""))
            return [UserMessageChunk(session_update="user_message_chunk",
                                     content=TextContentBlock(type="text", text=text))] if text else []
        if t == "tool.call":
            cid, name, args = str(ev["call_id"]), str(ev.get("name", "")), ev.get("args")
            self.calls[cid] = (name, args)
            return [ToolCallStart(session_update="tool_call", tool_call_id=cid, title=tool_title(name, args),
                                  kind=tool_kind(name, args), status="pending",
                                  locations=self.locations(args), raw_input=args)]
        if t == "policy.decision":
            return self._policy(ev)
        if t == "tool.result":
            cid = str(ev["call_id"])
            out = str(ev.get("output", ""))
            clipped = out if len(out) <= OUTPUT_CLIP else out[:OUTPUT_CLIP] + "\n[...]"
            return [ToolCallProgress(session_update="tool_call_update", tool_call_id=cid,
                                     status="completed" if ev.get("ok") else "failed",
                                     content=[text_content(clipped)] if clipped else None,
                                     raw_output={"ok": bool(ev.get("ok")), "output": out})]
        if t == "tool.skipped":
            return [ToolCallProgress(session_update="tool_call_update", tool_call_id=str(ev["call_id"]),
                                     status="failed",
                                     content=[text_content(f"skipped ({ev.get('reason', '')})")])]
        if t in ("plan.write", "plan.carried"):
            self.steps = [str(s) for s in ev.get("steps") or []]
            self.marks = {int(m) for m in ev.get("marks") or []}
            return [self.plan()]
        if t == "plan.step":
            self.marks.add(int(ev.get("step", 0)))
            return [self.plan()]
        if t == "usage":
            self.cost += float(ev.get("cost") or 0.0)
            if ev.get("purpose") != "turn":
                return []
            used = int(ev.get("input_tokens") or 0) + int(ev.get("output_tokens") or 0)
            return [UsageUpdate(session_update="usage_update", used=used, size=max(self.context_size, used),
                                cost=Cost(amount=round(self.cost, 6), currency="USD"))]
        if t == "title.set":
            return [SessionInfoUpdate(session_update="session_info_update", title=str(ev.get("title", "")))]
        if t == "session.updated":
            return self._settings(ev.get("changes") or {})
        return []

    def _policy(self, ev: Event) -> list[Update]:
        cid = str(ev["call_id"])
        verdict = ev.get("verdict")
        content: list[Any] = []
        preview = ev.get("preview")
        if isinstance(preview, dict) and cid in self.calls:
            _name, args = self.calls[cid]
            path = preview.get("path") or (args.get("path") if isinstance(args, dict) else None)
            if isinstance(path, str):
                d = diff_from_preview(self.abs(path), preview, args)
                if d is not None:
                    content.append(d)
        if verdict == "allow":
            return [ToolCallProgress(session_update="tool_call_update", tool_call_id=cid, status="in_progress",
                                     content=content or None)]
        if verdict == "refuse":
            content.append(text_content(f"refused ({ev.get('actor', '')}): {ev.get('reason', '')}"))
            return [ToolCallProgress(session_update="tool_call_update", tool_call_id=cid, status="failed",
                                     content=content)]
        return [ToolCallProgress(session_update="tool_call_update", tool_call_id=cid, content=content)] if content else []

    def _settings(self, changes: dict[str, Any]) -> list[Update]:
        out: list[Update] = []
        if "dont_ask" in changes:
            out.append(CurrentModeUpdate(session_update="current_mode_update",
                                         current_mode_id=DONT_ASK if changes["dont_ask"] else ASK))
        if changes.get("model"):
            out.append(ConfigOptionUpdate(session_update="config_option_update",
                                          config_options=[model_option(str(changes["model"]), self.models)]))
        return out


def chunk(text: str) -> AgentMessageChunk:
    return AgentMessageChunk(session_update="agent_message_chunk", content=TextContentBlock(type="text", text=text))
