"""The model's view of a session, rebuilt from its event log.

The log is the only record of a conversation, so any runner can pick a session up: user
messages become user prompts (their ``via`` kept in request metadata), ``assistant.msg`` a model
response with its tool calls, ``tool.result``/``tool.skipped`` the tool returns, and an
``observed`` operator command is folded into the next tool result the model reads.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

TURN_STARTS = frozenset({"send", "queue", "steer"})

SKIP_TEXT = {
    "lead": "Skipped: the person sent a newer instruction (a Lead) before this call started. "
            "Read it and decide what to do next.",
    "steer": "Cancelled: the person steered the conversation before this call started.",
    "stop": "Cancelled: the person stopped the turn before this call started.",
    "truncated": "Not run: the response was cut off by the output limit, so its tool calls were not executed.",
    "limit": "Not run: the turn ended at a limit before this call started.",
}


def skip_text(reason: str) -> str:
    return SKIP_TEXT.get(reason, f"Skipped ({reason}).")


def observed_text(command: str, output: str) -> str:
    return f"\n\n[The operator ran `{command}` in the workspace; its output:]\n{output}"


class Builder:
    """Accumulates messages; the turn loop uses the same builder for what it adds live."""

    def __init__(self) -> None:
        self.messages: list[ModelMessage] = []
        self._parts: list[ModelRequestPart] = []
        self._vias: list[str] = []
        self._calls: dict[str, str] = {}
        self._observed: list[str] = []

    # -- requests
    def user(self, text: str, via: str) -> None:
        if via in TURN_STARTS:
            self.flush()
        self._parts.append(UserPromptPart(content=text))
        self._vias.append(via)

    def tool_return(self, call_id: str, content: str, name: str | None = None) -> None:
        if self._observed:
            content += "".join(self._observed)
            self._observed.clear()
        self._parts.append(ToolReturnPart(tool_name=name or self._calls.get(call_id, "tool"),
                                          content=content, tool_call_id=call_id))

    def observed(self, command: str, output: str) -> None:
        self._observed.append(observed_text(command, output))

    def flush(self) -> None:
        if self._parts:
            self.messages.append(ModelRequest(parts=list(self._parts), metadata={"cox_vias": list(self._vias)}))
            self._parts.clear()
            self._vias.clear()

    @property
    def has_pending(self) -> bool:
        return bool(self._parts)

    # -- responses
    def response(self, resp: ModelResponse) -> None:
        self.flush()
        for p in resp.parts:
            if isinstance(p, ToolCallPart):
                self._calls[p.tool_call_id] = p.tool_name
        self.messages.append(resp)

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


def build(events: list[dict[str, Any]]) -> Builder:
    b = Builder()
    for ev in events:
        t = ev.get("type")
        if t == "user.msg":
            b.user(ev.get("text", ""), ev.get("via", "send"))
        elif t == "assistant.msg":
            b.assistant(ev.get("text", ""), ev.get("tool_calls") or [], ev.get("finish_reason"))
        elif t == "tool.result":
            b.tool_return(ev["call_id"], ev.get("output", ""))
        elif t == "tool.skipped":
            b.tool_return(ev["call_id"], skip_text(ev.get("reason", "")))
        elif t == "observed":
            b.observed(ev.get("command", ""), ev.get("output", ""))
    return b
