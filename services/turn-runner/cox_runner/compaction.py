"""Compaction: keep a long turn's transcript inside the model's context window.

Before every model request the loop asks the :class:`Compactor` (one hook, ``before_request``)
how many input tokens the request is about to send: the provider's reported tokens of the last
request and its response, plus an estimate (characters / 4) of what was added since, and never
less than the estimate of the whole request. Past ``[limits] compact_at`` times the model's window
(``context_window``), the older part of the transcript is summarized by a model request
(``[model] compactor``, else the session's model) and replaced by that summary. The request that
follows holds, in this order: the system prompt and the plan with its marks (instructions), the
turn's original message verbatim, the summary, every Lead and approval message of the turn
verbatim, then the most recent exchanges as they were (a tool call always with its result: the
kept part starts at a model response). A failed summary falls back to replacing the oldest tool
outputs by a short note; if even that does not fit the window, the turn ends ``context_full``.

Every compaction is a ``context.compacted`` event; the log keeps everything. The rewrite is a
pure function of the transcript and the event (:func:`apply_event`), so a transcript rebuilt from
the log (:func:`cox_runner.transcript.build`) is the compacted one plus what follows.

The model request a compaction makes counts toward the turn's token limit (and spend). Before a
model request no call is open and no approval pending, so it is always a safe boundary; a
person's compaction (``POST /v1/sessions/{sid}/compact``) runs only between turns.
"""

from __future__ import annotations

import asyncio
import json
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_ai.direct import model_request
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from coxswain import events as ev
from coxswain.errors import CoxError, logged

from .budget import Budget
from .errors import LeaseLost, StopRequested
from .model import usage
from .turn import Ending, EndTurn, Turn
from .workspace import tooldefs

COMPACT_MARK = "You are compacting a conversation"
COMPACT_PROMPT = (
    COMPACT_MARK + " between a person and a coding agent so that it fits the model's context window. "
    "Summarize the transcript below for the agent, who will continue the work from your summary: the "
    "task, what was done (files read and written, commands run and what they showed), decisions, "
    "problems still open and what remains to do. Keep file names, commands and error messages exact. "
    "Answer with the summary only."
)
SUMMARY_VIA = "summary"
SUMMARY_HEAD = "[Summary of the earlier conversation, compacted to fit the context window]\n"
DROPPED_TEXT = "[This tool output was dropped to fit the context window.]"
TURN_STARTS = frozenset({"send", "queue", "steer"})
KEPT_VIAS = frozenset({"lead", "approval"})
COMPACT_TIMEOUT_S = 300.0
DEFAULT_WINDOW = 200_000
"""For a person's compaction on a model whose window is unknown: how much the summarizer sees."""
RESULT_CLIP = 2000
"""Characters of one tool output shown to the summarizer."""
PART_OVERHEAD = 4
"""Tokens counted per message part beyond its text (roles, ids, separators)."""


class Transcript(Protocol):
    """What compaction needs of :class:`cox_runner.transcript.Builder` (which imports this
    module to rebuild a compacted transcript, so this one does not import it)."""

    messages: list[ModelMessage]
    seqs: list[int]
    seq: int

    def flush(self) -> None: ...


# ---------------------------------------------------------------- estimates (pure)


def text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _tools_tokens() -> int:
    return text_tokens(json.dumps([[t.name, t.description, t.parameters_json_schema] for t in tooldefs.TOOLS]))


TOOLS_TOKENS = _tools_tokens()


def message_tokens(m: ModelMessage) -> int:
    n = 0
    for p in m.parts:
        if isinstance(p, UserPromptPart):
            n += text_tokens(p.content if isinstance(p.content, str) else str(p.content))
        elif isinstance(p, ToolReturnPart):
            n += text_tokens(str(p.content)) + text_tokens(p.tool_name)
        elif isinstance(p, TextPart):
            n += text_tokens(p.content)
        elif isinstance(p, ToolCallPart):
            n += text_tokens(p.tool_name) + text_tokens(p.args_as_json_str())
        n += PART_OVERHEAD
    return n


def estimate(messages: list[ModelMessage], instructions: str = "") -> int:
    """Input tokens a request of ``messages`` with ``instructions`` (and the tools) takes, about."""
    return sum(message_tokens(m) for m in messages) + text_tokens(instructions) + TOOLS_TOKENS


class Estimates:
    """:func:`estimate` for a history estimated again before every request. The history of the
    last call is kept with the running sum of its messages' counts, so a request counts only the
    messages from the first one that is not the same object on (the transcript appends messages
    and a compaction puts new objects in the place of those it rewrites), and the last message
    of the last call again if it was extended in place (it has more parts). The unchanged prefix
    is found by one C-level identity comparison, no Python step per message. Estimating all of
    it each time serialized every tool call's arguments again (3.4 ms a request at 400 messages
    of file writes); a lookup per message still cost 11% of a runner's time at 900 messages,
    one read a step. The transcript owns one (``transcript.Builder.estimates``), so it lives as
    long as the transcript: carried to the drive's next turn, kept for the session's next drive
    here."""

    def __init__(self) -> None:
        self._msgs: list[ModelMessage] = []
        self._last_parts = 0
        """How many parts the last message of the last call had."""
        self._sums: list[int] = [0]
        """``_sums[i]``: the tokens of ``_msgs[:i]``."""

    def since(self, start: int) -> int:
        """Tokens of the messages from ``start`` on, of the history the last call counted."""
        return self._sums[-1] - self._sums[min(max(start, 0), len(self._msgs))]

    def __call__(self, messages: list[ModelMessage], instructions: str = "") -> int:
        old = self._msgs
        k = min(len(old), len(messages))
        if not all(map(operator.is_, old, messages)):
            k = list(map(operator.is_, old, messages)).index(False)
        if k and k == len(old) and len(old[-1].parts) != self._last_parts:
            k -= 1  # the last one was extended in place
        sums = self._sums
        del sums[k + 1:]
        total = sums[-1]
        for m in messages[k:]:
            total += message_tokens(m)
            sums.append(total)
        self._msgs = list(messages)
        self._last_parts = len(messages[-1].parts) if messages else 0
        return total + text_tokens(instructions) + TOOLS_TOKENS


# ---------------------------------------------------------------- the rewrite (pure)


def user_parts(req: ModelRequest) -> list[tuple[UserPromptPart, str, int]]:
    """The user prompts of a request with their ``via`` and how many responses a compaction
    elided after each (``cox_after``; the script model counts its steps with them)."""
    meta = req.metadata or {}
    vias = list(meta.get("cox_vias") or [])
    afters = list(meta.get("cox_after") or [])
    out: list[tuple[UserPromptPart, str, int]] = []
    for p in req.parts:
        if isinstance(p, UserPromptPart):
            i = len(out)
            out.append((p, vias[i] if i < len(vias) else "send", int(afters[i]) if i < len(afters) else 0))
    return out


def turn_start(messages: list[ModelMessage]) -> int | None:
    """The index of the request holding the current turn's original message (the latest
    send, queued or steered message), or None."""
    for k in range(len(messages) - 1, -1, -1):
        m = messages[k]
        if isinstance(m, ModelRequest) and any(via in TURN_STARTS for _, via, _ in user_parts(m)):
            return k
    return None


def _cut_at(b: Transcript, through_seq: int) -> int:
    """Where the kept part starts: the first response of the turn recorded after ``through_seq``."""
    start = turn_start(b.messages)
    lo = 0 if start is None else start + 1
    for k in range(lo, len(b.messages)):
        if isinstance(b.messages[k], ModelResponse) and b.seqs[k] > through_seq:
            return k
    return len(b.messages)


def choose_cut(b: Transcript, keep_tokens: int) -> tuple[int, int]:
    """(index, through_seq): keep verbatim the longest run of recent exchanges that fits in
    ``keep_tokens`` and starts at a model response of this turn (so no kept tool result lacks
    its call); everything before is summarized."""
    b.flush()
    msgs = b.messages
    start = turn_start(msgs)
    lo = 0 if start is None else start + 1
    size = 0
    cut = len(msgs)
    for k in range(len(msgs) - 1, lo - 1, -1):
        size += message_tokens(msgs[k])
        if size > keep_tokens:
            break
        if isinstance(msgs[k], ModelResponse):
            cut = k
    through = b.seqs[cut] - 1 if cut < len(msgs) else b.seq
    return cut, through


def fixed_tokens(b: Transcript, instructions: str) -> int:
    """What a compacted request holds whatever is cut: instructions, tools, and the turn's user
    messages (its original message, Leads, approval messages), which are kept verbatim."""
    start = turn_start(b.messages)
    users = 0
    for m in b.messages[start or 0:]:
        if isinstance(m, ModelRequest):
            users += sum(text_tokens(str(p.content)) + PART_OVERHEAD for p, via, _ in user_parts(m)
                         if via != SUMMARY_VIA)
    return estimate([], instructions) + users


def keep_budget(b: Transcript, instructions: str, target: int) -> int:
    """Tokens of recent exchanges to keep verbatim: half of what the fixed part and a summary
    leave under ``target``, so the next compaction is some requests away."""
    return max(0, (target - fixed_tokens(b, instructions) - target // 8) // 2)


def worth_summarizing(messages: list[ModelMessage]) -> bool:
    """Anything for a summary to replace: a response, or an earlier summary."""
    return any(isinstance(m, ModelResponse) or (isinstance(m, ModelRequest) and any(
        via == SUMMARY_VIA for _, via, _ in user_parts(m))) for m in messages)


def apply_summary(b: Transcript, through_seq: int, summary: str) -> None:
    """Replace what precedes the kept part by one request: the turn's original message, the
    summary, then the turn's Leads and approval messages, all verbatim."""
    b.flush()
    msgs = b.messages
    start = turn_start(msgs)
    cut = _cut_at(b, through_seq)
    kept: list[list[Any]] = []  # [part, via, responses elided after it]
    if start is not None:
        for k in range(start, cut):
            m = msgs[k]
            if isinstance(m, ModelResponse):
                if kept:
                    kept[-1][2] += 1
                continue
            if not isinstance(m, ModelRequest):
                continue
            parts = user_parts(m)
            orig = max((i for i, (_, via, _) in enumerate(parts) if via in TURN_STARTS), default=-1) \
                if k == start else -1
            for i, (part, via, after) in enumerate(parts):
                if i == orig or (kept and via in KEPT_VIAS):
                    kept.append([part, via, 0])
                if kept:
                    kept[-1][2] += after
    head = [kept[0]] if kept else []
    head.append([UserPromptPart(content=SUMMARY_HEAD + summary), SUMMARY_VIA, 0])
    head.extend(kept[1:])
    req = ModelRequest(parts=[h[0] for h in head],
                       metadata={"cox_vias": [h[1] for h in head], "cox_after": [h[2] for h in head]})
    b.messages = [req, *msgs[cut:]]
    b.seqs = [through_seq, *b.seqs[cut:]]


def _returns(b: Transcript) -> list[tuple[int, int]]:
    """(message index, part index) of every tool output not dropped yet, oldest first."""
    out = []
    for k, m in enumerate(b.messages):
        if isinstance(m, ModelRequest):
            out += [(k, i) for i, p in enumerate(m.parts)
                    if isinstance(p, ToolReturnPart) and p.content != DROPPED_TEXT]
    return out


def drop_outputs(b: Transcript, n: int) -> int:
    """Replace the ``n`` oldest tool outputs (not dropped yet) by a note; how many were."""
    b.flush()
    done = 0
    for k, i in _returns(b)[:n]:
        m = b.messages[k]
        assert isinstance(m, ModelRequest)
        parts = list(m.parts)
        old = parts[i]
        assert isinstance(old, ToolReturnPart)
        parts[i] = ToolReturnPart(tool_name=old.tool_name, content=DROPPED_TEXT, tool_call_id=old.tool_call_id)
        b.messages[k] = ModelRequest(parts=parts, instructions=m.instructions, metadata=m.metadata)
        done += 1
    return done


def drop_until(b: Transcript, fits: Callable[[], bool]) -> int:
    """Drop the oldest tool outputs one by one until ``fits()``; how many were dropped."""
    n = 0
    while not fits() and drop_outputs(b, 1):
        n += 1
    return n


def apply_event(b: Transcript, event: dict[str, Any]) -> None:
    """Apply a recorded ``context.compacted`` to a transcript being rebuilt from the log."""
    summary = str(event.get("summary") or "")
    if summary:
        apply_summary(b, int(event.get("through_seq") or 0), summary)
    dropped = int(event.get("dropped") or 0)
    if dropped:
        drop_outputs(b, dropped)


def render(messages: list[ModelMessage], max_chars: int) -> str:
    """The transcript as text for the summarizer (a text, so no call/result pairing applies)."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, ModelRequest):
            users = iter(user_parts(m))
            for p in m.parts:
                if isinstance(p, UserPromptPart):
                    _, via, _ = next(users)
                    text = p.content if isinstance(p.content, str) else str(p.content)
                    lines.append(f"[earlier summary] {text}" if via == SUMMARY_VIA else f"[person, {via}] {text}")
                elif isinstance(p, ToolReturnPart):
                    lines.append(f"[result of {p.tool_name}] {_clip(str(p.content), RESULT_CLIP)}")
        elif isinstance(m, ModelResponse):
            for r in m.parts:
                if isinstance(r, TextPart) and r.content:
                    lines.append(f"[agent] {r.content}")
                elif isinstance(r, ToolCallPart):
                    lines.append(f"[agent calls {r.tool_name}] {_clip(r.args_as_json_str(), 500)}")
    return _clip("\n".join(lines), max_chars, keep_head=0.25)


def _clip(text: str, limit: int, keep_head: float = 0.5) -> str:
    if len(text) <= limit:
        return text
    head = int(limit * keep_head)
    tail = max(0, limit - head - 60)
    return text[:head] + f"\n[... {len(text) - head - tail} characters left out ...]\n" + text[len(text) - tail:]


# ---------------------------------------------------------------- the summary request


@dataclass
class Summary:
    text: str
    tokens: int
    cost: float
    usage: dict[str, Any]
    """The request's ``usage`` event fields (:func:`cox_runner.model.usage.usage_of`)."""


async def summarize(deps: Any, model_name: str, text: str, focus: str | None = None) -> Summary:
    """One model request that summarizes ``text`` (raises whatever the request raises)."""
    model = await deps.models.load(model_name)
    prompt = COMPACT_PROMPT + (f"\n\nFocus the summary on: {focus}" if focus else "")
    req = ModelRequest(parts=[UserPromptPart(content=text)], instructions=prompt,
                       metadata={"cox_purpose": "compact", "cox_vias": ["compact"]})
    resp = await model_request(model, [req], model_settings=deps.models.settings(model_name))
    out = "".join(p.content for p in resp.parts if isinstance(p, TextPart)).strip()
    return Summary(out, resp.usage.input_tokens + resp.usage.output_tokens, usage.spend_cost(deps.models.prices(model_name), resp),
                   usage.usage_of(resp, deps.settings.model.provider(model_name)))



@dataclass
class Outcome:
    before: int
    after: int
    summary: str
    through_seq: int
    dropped: int

    @property
    def changed(self) -> bool:
        return bool(self.summary or self.dropped)


async def compact(b: Transcript, keep_tokens: int, target: int, instructions: str,
                  make_summary: Callable[[str], Any], before: int | None = None,
                  render_chars: int = 400_000) -> Outcome:
    """Compact ``b`` in place: summarize what precedes the recent exchanges that fit in
    ``keep_tokens``; if the summary fails (``make_summary`` returns "" or raises a plain
    exception) or the result still passes ``target``, drop the oldest tool outputs."""
    b.flush()
    before = estimate(b.messages, instructions) if before is None else before
    cut, through = choose_cut(b, keep_tokens)
    summary = ""
    if worth_summarizing(b.messages[:cut]):
        summary = str(await make_summary(render(b.messages[:cut], render_chars)) or "").strip()
    if summary:
        apply_summary(b, through, summary)
    dropped = 0
    if estimate(b.messages, instructions) > target:
        dropped = drop_until(b, lambda: estimate(b.messages, instructions) <= target)
    return Outcome(before, estimate(b.messages, instructions), summary, through, dropped)


# ---------------------------------------------------------------- the turn's compactor


@dataclass
class Compactor:
    """The loop's part that keeps its requests inside the window (one call before each request)."""

    deps: Any
    """The runner's :class:`cox_runner.deps.Deps` (not imported: ``leases`` imports the transcript,
    which imports this module)."""
    turn: Turn
    rec: Any
    """The turn's :class:`cox_runner.recorder.Recorder` (its ``history`` and ``emit``)."""
    budget: Budget
    log: Any
    instructions: Callable[[], str]
    guarded: Callable[[Any], Any]
    _mark: tuple[int, int] | None = field(default=None, init=False)
    """(budget tokens, transcript length) when the last request went out."""
    pre_compact: Callable[[str], Any] | None = None
    """The turn's PreCompact hooks (``cox_runner.hooks``), told before a compaction."""

    def window(self) -> int | None:
        window: int | None = self.deps.models.window(self.turn.model)
        return window

    def expected(self) -> int:
        """Input tokens of the request about to go out: the provider's count of the last request
        and its response plus an estimate of what was added since, never below the estimate of
        the whole request."""
        b = self.rec.history
        est: Estimates = b.estimates
        whole = est(b.messages, self.instructions())
        if self._mark is None or self._mark[1] > len(b.messages):
            return whole
        tokens, length = self._mark
        reported = self.budget.tokens - tokens
        added = est.since(length)
        return max(whole, reported + added)

    async def before_request(self) -> None:
        b = self.rec.history
        b.flush()
        window = self.window()
        if window is not None:
            expected = self.expected()
            if expected > self.deps.settings.limits.compact_at * window:
                await self._compact(expected, window)
        self._mark = (self.budget.tokens, len(b.messages))

    async def after_refusal(self) -> None:
        """The provider refused the last request as too long for its window (our estimate came in
        under its count, or the window is not configured): compact to well under what was sent
        and let the caller send it again once."""
        b = self.rec.history
        b.flush()
        expected = self.expected()
        window = min(self.window() or expected, expected) * 3 // 4
        self.log.warning("compaction.after_refusal", sent=expected, window=window)
        await self._compact(expected, max(window, 1))
        self._mark = None

    async def _compact(self, expected: int, window: int) -> None:
        if self.pre_compact is not None:
            await self.guarded(self.pre_compact("auto"))
        target = int(self.deps.settings.limits.compact_at * window)
        instructions = self.instructions()
        name = self.deps.settings.model.compactor or self.turn.model

        async def make_summary(text: str) -> str:
            left = self.budget.time_left(time.monotonic())
            try:
                s = await self.guarded(asyncio.wait_for(summarize(self.deps, name, text),
                                                        max(0.001, min(COMPACT_TIMEOUT_S, left))))
            except (StopRequested, LeaseLost, asyncio.CancelledError, EndTurn):
                raise
            except (Exception, CoxError) as exc:  # noqa: BLE001 - a failed summary falls back
                self.log.warning("compaction.summary_failed", error=logged(exc))
                return ""
            self.budget.add_response(s.tokens, s.cost)
            await self.rec.emit(ev.Usage(**self.rec.e(), purpose="compaction", model=name, **s.usage),
                                ops=usage.totals_ops(s.usage))
            await self.deps.clients.usage_seen({"model": name, "purpose": "compaction", **s.usage})
            return str(s.text)

        keep = keep_budget(self.rec.history, instructions, target)
        out = await compact(self.rec.history, keep_tokens=keep, target=target, instructions=instructions,
                            make_summary=make_summary, before=expected, render_chars=window * 2)
        self.log.info("compaction.done", before=out.before, after=out.after, dropped=out.dropped,
                      summarized=bool(out.summary))
        if out.changed:
            await self.rec.emit(ev.ContextCompacted(**self.rec.e(), before_tokens=out.before,
                                                    after_tokens=out.after, summary=out.summary,
                                                    through_seq=out.through_seq, dropped=out.dropped))
        if out.after > window:
            raise EndTurn(Ending("context_full", detail=f"the transcript needs about {out.after} tokens after "
                                                        f"compaction; the model's window is {window}"))
