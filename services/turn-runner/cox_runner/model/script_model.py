"""The built-in ``script`` model: a pydantic-ai model that follows a JSON script, no network.

The model reads the latest user message (a send, a queued or steered message, a Lead, or an
approval's message) that holds a fenced block tagged ``script``; the n-th model request after
that message returns step n. Past the last step it answers ``script done``. A turn-starting
message without a script gets a one-line echo. A Lead holding a script replaces the steps that
remain (it is the latest scripted message now); a Lead or approval message *without* a script
leaves the running script alone.

Because it is a real :class:`pydantic_ai.models.Model`, the runner's loop drives it through the
same ``model_request_stream`` call as a real provider: streaming deltas, tool calls, usage and
finish reasons all take the same path.

How a request says which kind of user message it carries: the runner sets
``ModelRequest.metadata["cox_vias"]``, one ``via`` per user prompt part (real providers ignore
metadata). Title requests carry ``metadata["cox_purpose"] = "title"``, compaction summaries
``"compact"`` (answered with a short deterministic summary). A compacted transcript's first
request says, per user prompt, how many responses it replaced after it (``cox_after``), so
the step count goes on where it was; its summary prompt (``via`` ``summary``) is never a script.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    ModelResponseStreamEvent,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.profiles import ModelProfile
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

SCRIPT_RE = re.compile(r"```script[ \t]*\r?\n(.*?)```", re.DOTALL)
TURN_STARTS = frozenset({"send", "queue", "steer"})
DONE_TEXT = "script done"


class ScriptTool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str | None = None
    tools: list[ScriptTool] = Field(default_factory=list)
    finish: str = "stop"
    delay_ms: int = Field(0, ge=0, le=600_000)
    tokens: int | None = Field(None, ge=0)
    malformed: bool = False
    history: bool = False
    """Answer with the user messages of the request (the transcript the model was given): the
    text ``history: `` and a JSON list of the first line of each turn's message (sends, queued
    and steered messages), oldest first."""


class ScriptError(ValueError):
    """The script block is not valid JSON of the documented shape."""


CACHED_BLOCK_MAX = 64 * 1024
"""Script blocks up to this size keep their parsed steps (:func:`_steps`)."""


def parse_script(text: str) -> tuple[ScriptStep, ...] | None:
    """The steps of the last ``script`` block in ``text``; None if it has none."""
    block = _last_block(text) if len(text) <= CACHED_BLOCK_MAX else _find_last_block(text)
    if block is None:
        return None
    return _steps(block) if len(block) <= CACHED_BLOCK_MAX else _parse_steps(block)


def _find_last_block(text: str) -> str | None:
    blocks = SCRIPT_RE.findall(text)
    return blocks[-1] if blocks else None


@functools.lru_cache(maxsize=32)
def _last_block(text: str) -> str | None:
    """Every request of a turn looks for the block in the same message text (the transcript holds
    it, so its hash is computed once): scanning a 300-step script's 18 KB was 7% of a runner's
    time in a turn of one call per response."""
    return _find_last_block(text)


@functools.lru_cache(maxsize=32)
def _steps(block: str) -> tuple[ScriptStep, ...]:
    """Every model request of a turn finds its step by parsing the script again (the request
    carries the transcript, not a position): a 400-step script took 4.4 ms to parse, at every
    step. The parsed steps are frozen, so one parse serves every request that holds the block.
    A block that fails raises each time (lru_cache keeps no exception)."""
    return _parse_steps(block)


def _parse_steps(block: str) -> tuple[ScriptStep, ...]:
    try:
        raw = json.loads(block)
    except ValueError as exc:
        raise ScriptError(f"script block is not JSON: {exc}") from exc
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise ScriptError("script block must be a JSON list of steps")
    try:
        return tuple(ScriptStep.model_validate(s) for s in raw)
    except ValidationError as exc:
        raise ScriptError(f"script step is not valid: {exc.errors()[0]['msg']}") from exc


def _user_texts(req: ModelRequest) -> list[tuple[str, str]]:
    return [(text, via) for text, via, _ in _user_parts(req)]


def _user_parts(req: ModelRequest) -> list[tuple[str, str, int]]:
    """(text, via, responses a compaction replaced after it) of each user prompt."""
    vias = list((req.metadata or {}).get("cox_vias") or [])
    afters = list((req.metadata or {}).get("cox_after") or [])
    out: list[tuple[str, str, int]] = []
    for part in req.parts:
        if isinstance(part, UserPromptPart):
            text = part.content if isinstance(part.content, str) else " ".join(
                c for c in part.content if isinstance(c, str)
            )
            via = vias.pop(0) if vias else "send"
            after = int(afters.pop(0)) if afters else 0
            out.append((text, via, after))
    return out


@dataclass
class Plan:
    """What the script says this request should answer."""

    step: ScriptStep
    call_prefix: str


def plan_for(messages: list[ModelMessage]) -> Plan:
    """Walk back to the latest scripted user message and count the responses since."""
    responses = 0
    for msg in reversed(messages):
        if isinstance(msg, ModelResponse):
            responses += 1
            continue
        if not isinstance(msg, ModelRequest):
            continue
        if not any(isinstance(p, UserPromptPart) for p in msg.parts):
            continue  # a tool result: no user prompt to count from (most of a long turn)
        if (msg.metadata or {}).get("cox_purpose") == "title":
            continue
        for text, via, after in reversed(_user_parts(msg)):
            responses += after
            if via == "summary":
                continue
            try:
                steps = parse_script(text)
            except ScriptError as exc:
                return Plan(ScriptStep(text=f"script error: {exc}"), "err")
            if steps is not None:
                if responses < len(steps):
                    return Plan(steps[responses], f"s{responses}")
                return Plan(ScriptStep(text=DONE_TEXT), "done")
            if via in TURN_STARTS:
                if responses == 0:
                    first = text.strip().splitlines()[0] if text.strip() else ""
                    return Plan(ScriptStep(text=f"echo: {first[:200]}"), "echo")
                return Plan(ScriptStep(text=DONE_TEXT), "done")
    return Plan(ScriptStep(text=DONE_TEXT), "done")


def history_for(messages: list[ModelMessage]) -> str:
    """``history: [...]``: the first line of every turn-starting user message the request holds."""
    firsts = [(SCRIPT_RE.sub(" ", text).strip().splitlines() or [""])[0]
              for m in messages if isinstance(m, ModelRequest) for text, via in _user_texts(m)
              if via in TURN_STARTS]
    return "history: " + json.dumps(firsts, ensure_ascii=False)


def title_for(messages: list[ModelMessage]) -> str:
    """First five words of the first user message in the title request."""
    for msg in messages:
        if isinstance(msg, ModelRequest):
            for text, _ in _user_texts(msg):
                cleaned = SCRIPT_RE.sub(" ", text)
                words = cleaned.split()
                if words:
                    return " ".join(words[:5])[:200]
    return "Untitled"


def summary_for(messages: list[ModelMessage]) -> str:
    """A compaction summary: what the transcript it was given holds, counted (no script in it)."""
    text = " ".join(t for m in messages if isinstance(m, ModelRequest) for t, _ in _user_texts(m))
    calls = re.findall(r"^\[agent calls (\w+)\]", text, re.MULTILINE)
    counts = ", ".join(f"{n} x{calls.count(n)}" for n in sorted(set(calls))) or "none"
    return f"Summary by the script model: {len(text.splitlines())} lines of conversation; tool calls: {counts}."


def _parts(plan: Plan) -> list[ModelResponsePart]:
    parts: list[ModelResponsePart] = []
    if plan.step.text:
        parts.append(TextPart(content=plan.step.text))
    for i, tool in enumerate(plan.step.tools):
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        args: str | dict[str, Any]
        args = '{"path": ' if plan.step.malformed and i == 0 else copy.deepcopy(tool.args)  # the step is shared
        parts.append(ToolCallPart(tool_name=tool.name, args=args, tool_call_id=call_id))
    return parts


def _usage(plan: Plan, parts: list[ModelResponsePart]) -> RequestUsage:
    if plan.step.tokens is not None:
        return RequestUsage(input_tokens=0, output_tokens=plan.step.tokens)
    out = sum(len(str(getattr(p, "content", "") or getattr(p, "args", ""))) // 4 + 1 for p in parts)
    return RequestUsage(input_tokens=10, output_tokens=out)


def _finish(plan: Plan) -> Any:
    f = plan.step.finish
    return f if f in ("stop", "length", "content_filter", "tool_call", "error") else "stop"


_now = time.monotonic
"""The clock the stream's chunks are due by (a test's fake one in its place)."""


class ScriptModel(Model):
    """A scripted model with no network and no key (docs/api.md, "The script model")."""

    def __init__(self) -> None:
        super().__init__(profile=ModelProfile(supports_tools=True))

    @property
    def model_name(self) -> str:
        return "script"

    @property
    def system(self) -> str:
        return "script"

    def _answer(self, messages: list[ModelMessage]) -> tuple[Plan, list[ModelResponsePart]]:
        last = messages[-1] if messages else None
        if isinstance(last, ModelRequest) and (last.metadata or {}).get("cox_purpose") == "title":
            return Plan(ScriptStep(text=title_for(messages)), "title"), []
        if isinstance(last, ModelRequest) and (last.metadata or {}).get("cox_purpose") == "compact":
            return Plan(ScriptStep(text=summary_for(messages)), "title"), []
        plan = plan_for(messages)
        if plan.step.history:
            plan = Plan(plan.step.model_copy(update={"text": history_for(messages)}), plan.call_prefix)
        if plan.call_prefix == "err":
            # A broken script is the request failing, not an answer: the turn ends ``error`` with
            # the reason, rather than "completed" with the error text as if the model said it.
            raise ScriptError(plan.step.text or "script error")
        return plan, _parts(plan)

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        plan, parts = self._answer(messages)
        if plan.call_prefix == "title":
            parts = [TextPart(content=plan.step.text or "")]
        if plan.step.delay_ms:
            await asyncio.sleep(plan.step.delay_ms / 1000)
        return ModelResponse(parts=parts, usage=_usage(plan, parts), model_name="script",
                             finish_reason=_finish(plan))

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse]:
        plan, parts = self._answer(messages)
        if plan.call_prefix == "title":
            parts = [TextPart(content=plan.step.text or "")]
        yield ScriptStream(model_request_parameters=model_request_parameters, plan=plan, script_parts=parts)


@dataclass
class ScriptStream(StreamedResponse):
    plan: Plan = field(default_factory=lambda: Plan(ScriptStep(), ""))
    script_parts: list[ModelResponsePart] = field(default_factory=list)
    _ts: datetime = field(default_factory=lambda: datetime.now(UTC))

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        step = self.plan.step
        text_chunks: list[str] = []
        for part in self.script_parts:
            if isinstance(part, TextPart):
                text_chunks = re.findall(r"\S+\s*|\s+", part.content) or [part.content]
        n = max(1, len(text_chunks))
        pause = step.delay_ms / 1000 / n if step.delay_ms else 0.0
        # Each chunk is due at its share of the delay from the start: a wake-up late by a timer's
        # rounding or a busy loop shortens the waits after it, so the response takes delay_ms
        # (plus one wake-up's lateness), not delay_ms plus every chunk's.
        start = _now()
        for k, chunk in enumerate(text_chunks, 1):
            if pause:
                await asyncio.sleep(max(0.0, start + k * pause - _now()))
            for ev in self._parts_manager.handle_text_delta(vendor_part_id="content", content=chunk):
                yield ev
        if not text_chunks and pause:
            await asyncio.sleep(pause)
        for i, part in enumerate(self.script_parts):
            if isinstance(part, ToolCallPart):
                yield self._parts_manager.handle_tool_call_part(
                    vendor_part_id=f"tool{i}", tool_name=part.tool_name, args=part.args,  # type: ignore[arg-type]
                    tool_call_id=part.tool_call_id,
                )
        self._usage = _usage(self.plan, self.script_parts)
        self.finish_reason = _finish(self.plan)

    @property
    def model_name(self) -> str:
        return "script"

    @property
    def provider_name(self) -> str | None:
        return None

    @property
    def provider_url(self) -> str | None:
        return None

    @property
    def timestamp(self) -> datetime:
        return self._ts
