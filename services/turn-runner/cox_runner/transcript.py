"""The model's view of a session, rebuilt from its event log.

The log is the only record of a conversation, so any runner can pick a session up: user
messages become user prompts (their ``via`` kept in request metadata), ``assistant.msg`` a model
response with its tool calls, ``tool.result``/``tool.skipped`` the tool returns. An operator
``!command`` is folded into the tool result that was recorded with it (``tool.result.observed``),
so the live loop and a rebuild show the model the same text.

Two invariants every request keeps, whatever the log holds:

- every tool call of a response has exactly one tool return, placed before any user prompt of
  the request that follows it (providers require tool returns right after the call); a call the
  log never closed (a crash the takeover could not record) gets a return saying so;
- user messages that arrive while tool returns are pending (a Lead, an approval's message, or the
  next turn's message after a turn that ended mid-round) join the same request, after the returns.

A ``context.compacted`` event rewrites what came before it the way the live loop did
(:mod:`cox_runner.compaction`), so a rebuilt transcript is the compacted one plus what follows.
A conversation rewind (``session.rewound``) starts the transcript over from the one it had at
the rewind's ``through_seq`` (:func:`coxswain.turns.rewound`); what follows the rewind is added.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)

from coxswain import attachments as att
from coxswain.turns import CONVERSATION_SCOPES, REWOUND, rewound

from .compaction import Estimates, apply_event

SKIP_TEXT = {
    "lead": "Skipped: the person sent a newer instruction (a Lead) before this call started. "
            "Read it and decide what to do next.",
    "approval": "Skipped: the person answered an approval with a message (a newer instruction) before "
                "this call started. Read it and decide what to do next.",
    "steer": "Cancelled: the person steered the conversation before this call started.",
    "stop": "Cancelled: the person stopped the turn before this call started.",
    "truncated": "Not run: the response was cut off by the output limit, so its tool calls were not executed.",
    "limit": "Not run: the turn ended at a limit before this call started.",
    "canceled": "Not run: the turn was cancelled before this call started.",
    "error": "Not run: the turn ended with an error before this call started.",
    "unavailable": "Not run: a service this call needed (the policy check or versions) could not be reached, "
                   "so the turn ended before the call ran.",
}
UNANSWERED_TEXT = "No result was recorded for this call: the turn ended before it finished."


def skip_text(reason: str) -> str:
    return SKIP_TEXT.get(reason, f"Skipped ({reason}).")


def observed_text(command: str, output: str) -> str:
    return f"\n\n[The operator ran `{command}` in the workspace; its output:]\n{output}"


def fold(observed: list[dict[str, Any]] | None) -> str:
    """The text of operator observations appended to a tool result."""
    return "".join(observed_text(str(o.get("command", "")), str(o.get("output", ""))) for o in observed or [])


@dataclass(frozen=True)
class AttachmentFiles:
    """Where a message's attachments are read from (the content-addressed folder) and where a
    file the model cannot take as a part is put for it (the workspace's store folder)."""

    root: Path
    store_dir: str
    workspace: Path
    withheld: frozenset[str] = frozenset()
    """Attachments not given to the model (``attachment.withheld``): named, their content left out."""
    images: bool = True
    """Whether the turn's model takes images; when not, an image is named instead of sent (an
    earlier message's, from when the session was on a model that did)."""

    def parts(self, attached: list[dict[str, Any]]) -> list[UserContent]:
        out: list[UserContent] = []
        for a in attached:
            name, media, size = str(a.get("name", "")), str(a.get("media_type", "")), int(a.get("size") or 0)
            label = f"Attached file {name} ({media}, {size} bytes)"
            if str(a.get("attachment_id", "")) in self.withheld:
                out.append(f"{label}: withheld: its content looks like a credential and the person did not allow "
                           "it to be given to you.")
                continue
            try:
                data = att.blob(self.root, self.store_dir, str(a.get("sha256", ""))).read_bytes()
            except (OSError, ValueError):
                out.append(f"{label}: its content is no longer kept.")
                continue
            kind = att.kind(media)
            if kind == "image" and not self.images:
                out.append(f"{label}: not shown: the model this turn runs on does not take images.")
            elif kind == "image":
                out.append(f"{label}:")
                out.append(BinaryContent(data=data, media_type=media, identifier=str(a.get("attachment_id", ""))))
            elif kind == "text":
                out.append(f"{label}:\n{data.decode('utf-8', errors='replace')}")
            else:
                rel = f"{self.store_dir}/{att.FOLDER}/{a.get('attachment_id', '')}-{att.safe_name(name)}"
                dest = self.workspace / rel
                if not dest.exists():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(dest.name + ".tmp")
                    tmp.write_bytes(data)
                    tmp.replace(dest)
                out.append(f"{label}, saved in the workspace at {rel} (read it there; it is read-only).")
        return out


def user_content(text: str, attached: list[dict[str, Any]] | None,
                 files: AttachmentFiles | None) -> str | list[UserContent]:
    """A person's message as the model gets it: the text, then each attachment (an image part,
    the text of a text file, or where a file was put). Without ``files`` only their names."""
    if not attached:
        return text
    if files is None:
        return text + "".join(f"\n[attached: {a.get('name')} ({a.get('media_type')})]" for a in attached)
    return [text, *files.parts(attached)]


class Builder:
    """Accumulates messages; the turn loop uses the same builder for what it adds live."""

    def __init__(self) -> None:
        self.messages: list[ModelMessage] = []
        self._returns: list[ToolReturnPart] = []
        self._users: list[UserPromptPart] = []
        self._vias: list[str] = []
        self._open: dict[str, str] = {}
        """Calls of the latest response that have no return yet: call_id -> tool name."""
        self.synthesized = 0
        """How many calls got a made-up "no result" return (should stay 0)."""
        self.seq = 0
        """The seq of the latest event known to be in this transcript (the recorder and
        :func:`build` keep it); a response remembers the seq it was recorded at."""
        self.seqs: list[int] = []
        """Per message, the value of :attr:`seq` when it was added (compaction cuts by it)."""
        self.estimates = Estimates()
        """Each message's token estimate, kept with the transcript (compaction's check before
        every request costs the messages added since, not the whole history, turn after turn)."""

    # -- requests
    def user(self, text: str, via: str, attached: list[dict[str, Any]] | None = None,
             files: AttachmentFiles | None = None) -> None:
        self._users.append(UserPromptPart(content=user_content(text, attached, files)))
        self._vias.append(via)

    def tool_return(self, call_id: str, content: str, name: str | None = None) -> None:
        """The return of an open call; a second return, or one for an unknown call, is dropped."""
        tool = self._open.pop(call_id, None)
        if tool is None:
            return
        self._returns.append(ToolReturnPart(tool_name=name or tool, content=content, tool_call_id=call_id))

    def _close_unanswered(self) -> None:
        for call_id in list(self._open):
            self.synthesized += 1
            self.tool_return(call_id, UNANSWERED_TEXT)

    def flush(self) -> None:
        self._close_unanswered()
        parts: list[ModelRequestPart] = [*self._returns, *self._users]
        if parts:
            self.messages.append(ModelRequest(parts=parts, metadata={"cox_vias": list(self._vias)}))
            self.seqs.append(self.seq)
        self._returns.clear()
        self._users.clear()
        self._vias.clear()


    # -- responses
    def response(self, resp: ModelResponse) -> None:
        self.flush()
        self.messages.append(resp)
        self.seqs.append(self.seq)
        self._open = {p.tool_call_id: p.tool_name for p in resp.parts if isinstance(p, ToolCallPart)}

    def assistant(self, text: str, tool_calls: list[dict[str, Any]], finish_reason: str | None) -> None:
        parts: list[ModelResponsePart] = []
        if text:
            parts.append(TextPart(content=text))
        for c in tool_calls:
            parts.append(ToolCallPart(tool_name=c["name"], args=c.get("args"), tool_call_id=c["call_id"]))
        if parts:
            self.response(ModelResponse(parts=parts, finish_reason=finish_reason))  # type: ignore[arg-type]

    def request_messages(self, instructions: str | None = None) -> list[ModelMessage]:
        """The history to send now: everything, with pending parts as the last request."""
        self.flush()
        msgs = list(self.messages)
        if instructions and msgs and isinstance(msgs[-1], ModelRequest):
            last = msgs[-1]
            msgs[-1] = ModelRequest(parts=last.parts, instructions=instructions, metadata=last.metadata)
        return msgs


def withheld(events: list[dict[str, Any]]) -> frozenset[str]:
    """The attachments the log says are not given to the model (rewound or not: a denial stays)."""
    return frozenset(str(e.get("attachment_id")) for e in events if e.get("type") == "attachment.withheld")


def build(events: list[dict[str, Any]], files: AttachmentFiles | None = None) -> Builder:
    b = Builder()
    if files is not None and (held := withheld(events)):
        files = dataclasses.replace(files, withheld=files.withheld | held)
    _fold(b, rewound(events), files)
    if events:  # a rewind leaves its own and later seqs out of the transcript, not out of the log
        b.seq = max(b.seq, max(int(e.get("seq") or 0) for e in events))
    return b


def foldable(events: list[dict[str, Any]]) -> bool:
    """Whether :func:`extend` takes these events the way :func:`build` would over the whole log:
    not when one is a conversation rewind (it replaces what came before) or an attachment
    withheld (it changes what an earlier message shows)."""
    return not any(e.get("type") == "attachment.withheld"
                   or (e.get("type") == REWOUND and e.get("scope") in CONVERSATION_SCOPES) for e in events)


def extend(b: Builder, events: list[dict[str, Any]], files: AttachmentFiles | None = None) -> Builder:
    """Fold the events that follow ``b.seq`` into ``b`` (:func:`foldable` ones): the same
    transcript :func:`build` makes of the log they complete (``b.seq`` moves to the last of them:
    nothing is left out of the fold, as a rewind leaves events out of :func:`build`'s)."""
    _fold(b, events, files)
    return b


def _fold(b: Builder, events: list[dict[str, Any]], files: AttachmentFiles | None) -> None:
    for ev in events:
        t = ev.get("type")
        b.seq = max(b.seq, int(ev.get("seq") or 0))
        if t == "context.compacted":
            apply_event(b, ev)
        elif t == "user.msg":
            b.user(ev.get("text", ""), ev.get("via", "send"), ev.get("attachments"), files)
        elif t == "assistant.msg":
            b.assistant(ev.get("text", ""), ev.get("tool_calls") or [], ev.get("finish_reason"))
        elif t == "tool.result":
            b.tool_return(ev["call_id"], ev.get("output", "") + fold(ev.get("observed")))
        elif t == "tool.skipped":
            b.tool_return(ev["call_id"], skip_text(ev.get("reason", "")))


def of_message(text: str, via: str, seq: int, files: AttachmentFiles | None = None) -> Builder:
    """The transcript of a session whose log holds, of what :func:`build` takes, one text message
    (``user.msg``) and nothing after ``seq``: a run's first turn (``cox_run`` made the session and
    began the turn in one call)."""
    return build([{"type": "user.msg", "seq": seq, "text": text, "via": via}], files)
