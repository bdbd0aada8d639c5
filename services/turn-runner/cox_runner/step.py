"""One model request of a turn: the request built, streamed, retried, its usage and limits, and
the session's title (docs/design.md, "The turn loop", steps 1 to 3).

The response streams as ``assistant.delta`` events, then ``assistant.msg`` with the calls it asked
for (recorded as open); a refusal as over the model's window compacts once and sends again. The
title is one small request to the same model, serialised with the turn's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pydantic_ai.direct import model_request, model_request_stream
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters

from coxswain import events as ev
from coxswain import keys
from coxswain.errors import CoxError, Fenced, logged

from . import handlers, spending
from .budget import Budget
from .checkpoints import Checkpoints
from .compaction import Compactor
from .deps import Deps
from .errors import LeaseLost, StopRequested
from .model import retry, usage
from .recorder import CLOSE_LEADS, Recorder, args_for_log
from .turn import Ending, EndTurn, Turn, guarded
from .workspace import tooldefs

TITLE_PROMPT = "Give this conversation a title of at most five words. Answer with the title only."
DELTA_FLUSH_CHARS = 256
DELTA_FLUSH_S = 0.05
TITLE_TIMEOUT_S = 120.0
USAGE_SAMPLE = {"model", "purpose", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost"}
"""The fields of a ``usage`` event the gateways' metrics count."""


class _TooLong(Exception):
    """The provider refused a request as over the model's context window."""


class ModelStep:
    def __init__(self, deps: Deps, turn: Turn, rec: Recorder, budget: Budget, checks: Checkpoints,
                 compactor: Compactor, instructions: Callable[[], str], log: Any) -> None:
        self.deps = deps
        self.turn = turn
        self.rec = rec
        self.budget = budget
        self.checks = checks
        self.compactor = compactor
        self.instructions = instructions
        """The system instructions as they stand (the turn loop's, with the plan)."""
        self.log = log
        self.settings = deps.settings
        self.limits = deps.settings.limits
        self.titled = False
        """The session has its title (or may not get one): no title request."""
        self._usage_ops: list[tuple[str, str, str, str]] = []
        self.may_defer: Callable[[list[ToolCallPart]], bool] = lambda calls: False
        """Whether a response asking for ``calls`` may be recorded with its first call's record
        rather than on its own (the turn loop's :meth:`~cox_runner.loop.TurnLoop.may_defer`)."""
        self.may_close: Callable[[], bool] = lambda: False
        """Whether a response that asks for no call may close Lead admission in its own record (the
        turn loop's :meth:`~cox_runner.loop.TurnLoop.may_close`)."""

    async def run(self) -> ModelResponse:
        try:
            return await self.once()
        except _TooLong:
            # Refused as over the model's window: compact to well under it and send once more
            # (a second refusal ends the turn ``error`` with the provider's message).
            await self.compactor.after_refusal()
            return await self.once(last_try=True)

    async def once(self, last_try: bool = False) -> ModelResponse:
        t = self.turn
        rec = self.rec
        await self.checks.daily()  # a daily budget reached (by this session, or its principal's others)
        await handlers.mcp_changes(rec, t.mcp)  # a server that died since: its tools are withdrawn now
        rec.take_pending()
        await self.compactor.before_request()  # keeps the request inside the context window
        messages = rec.history.request_messages(self.instructions())
        if rec.history.synthesized:
            self.log.warning("transcript.unanswered_calls", count=rec.history.synthesized)
        model = self.deps.models.get(t.model)
        offered = [*tooldefs.TOOLS, *(t.mcp.tool_defs() if t.mcp is not None else [])]
        params = ModelRequestParameters(function_tools=offered, allow_text_output=True)
        settings = self.deps.models.settings(t.model)
        remaining = self.limits.seconds - self.checks.elapsed()
        # The turn's time limit as a deadline on this task (asyncio.timeout), not wait_for's task
        # of its own: the request runs in the turn's task, under its guard (#23).
        deadline = asyncio.timeout(max(remaining, 0.001))
        try:
            async with deadline:
                response = await guarded(t, self._request(model, messages, params, settings))
        except (StopRequested, LeaseLost, asyncio.CancelledError, EndTurn, CoxError):
            raise
        except Exception as exc:  # any provider failure ends the turn with its reason
            if deadline.expired():  # the turn's time limit (a provider's own time-out is a failure)
                await rec.emit(ev.LimitHard(**rec.e(), limit="seconds", value=round(self.checks.elapsed(), 3)))
                raise EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s "
                                                            "reached while the model was answering")) from None
            if not last_try and retry.too_long(exc):
                self.log.warning("model.too_long", error=logged(exc))
                raise _TooLong from exc
            self.log.warning("model.failed", error=logged(exc))
            raise EndTurn(Ending("error", detail=f"model request failed: {exc}")) from exc

        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        cost = self._cost(response)
        usage: dict[str, Any] = {"input_tokens": response.usage.input_tokens,
                                 "output_tokens": response.usage.output_tokens}
        if cost:
            usage["cost"] = round(cost, 8)
        self.budget.add_response(response.usage.input_tokens + response.usage.output_tokens, cost)
        refs = [ev.ToolCallRef(call_id=c.tool_call_id, name=c.tool_name, args=args_for_log(c)) for c in calls]
        used = self._usage("turn", response)
        msg = ev.AssistantMsg(**rec.e(), text=text, finish_reason=response.finish_reason, usage=usage,
                              tool_calls=refs, provider_finish_reason=raw_finish(response))
        ops = [*(("hset", keys.OPEN_CALLS, c.tool_call_id, c.tool_name) for c in calls), *self._usage_ops]
        closes = not calls and response.finish_reason != "length" and self.may_close()
        if closes:
            ops.append(CLOSE_LEADS)  # the turn's last response: one call fewer (Leads.close_or_apply)
        if calls and self.may_defer(calls):
            rec.defer(used, msg, ops=ops)  # recorded with the read's own record: one call, not two
        elif closes and not spending.spends(ops):
            # Nothing comes between it and the turn's end: recorded by cox_turn_end, which closes
            # Lead admission with it (or, a Lead waiting, records it and the turn goes on).
            # Anything recorded before then (a limit, a warning) takes it along first.
            rec.defer(used, msg, ops=ops)
        else:
            await rec.emit(used, msg, ops=ops)
        await self.deps.clients.usage_seen(used.model_dump(include=USAGE_SAMPLE))
        rec.open = {c.tool_call_id: c for c in calls}
        rec.history.assistant(text, [r.model_dump() for r in refs], response.finish_reason)
        b = self.budget
        if b.tokens_over():
            await self.checks.hard("tokens", b.tokens)
        await self.checks.warnings()
        await self.checks.daily()
        if b.spend_over():
            await rec.emit(ev.LimitHard(**rec.e(), limit="spend", value=round(b.spend, 8)))
            raise EndTurn(Ending("spend_limit", detail=f"spend limit of ${self.limits.spend:g} reached "
                                                       f"(${b.spend:.6f})"))
        return response

    def _cost(self, response: ModelResponse) -> float:
        """USD this response counts against the turn's spend (:func:`cox_runner.model.usage.spend_cost`)."""
        return usage.spend_cost(self.deps.models.prices(self.turn.model), response)

    async def _request(self, model: Any, messages: list[Any], params: ModelRequestParameters,
                       settings: Any) -> ModelResponse:
        """One model request, retried while the provider fails in a way worth retrying (429, 5xx,
        time-outs, broken connections): capped exponential backoff with jitter, ``Retry-After``
        honoured, each retry a ``model.retry`` event. Stop and steer end a backoff at once (the
        whole request runs under :meth:`guarded`)."""
        cfg = self.settings.model

        async def on_retry(attempt: int, delay: float, exc: BaseException) -> None:
            said = retry.describe(exc)
            self.log.warning("model.retry", attempt=attempt, delay_s=round(delay, 3), error=said)
            await self.rec.emit(ev.ModelRetry(**self.rec.e(), attempt=attempt, delay_s=round(delay, 3), error=said))

        return await retry.with_retries(lambda: self._stream(model, messages, params, settings),
                                        on_retry=on_retry, retries=cfg.retries, max_s=cfg.retry_max_s)

    def _usage(self, purpose: str, response: ModelResponse) -> ev.Usage:
        """The ``usage`` event of one model request; :attr:`_usage_ops` add it to the session's totals."""
        t = self.turn
        u = usage.usage_of(response, self.settings.model.provider(t.model))
        self._usage_ops = usage.totals_ops(u)
        return ev.Usage(**self.rec.e(), purpose=purpose, model=t.model, **u)

    async def _stream(self, model: Any, messages: list[Any], params: ModelRequestParameters,
                      settings: Any) -> ModelResponse:
        buf: list[str] = []
        last = time.monotonic()
        async with model_request_stream(model, messages, model_settings=settings,
                                        model_request_parameters=params) as stream:
            async for event in stream:
                chunk = None
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    chunk = event.part.content
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    chunk = event.delta.content_delta
                if chunk:
                    buf.append(chunk)
                    now = time.monotonic()
                    if sum(map(len, buf)) >= DELTA_FLUSH_CHARS or now - last >= DELTA_FLUSH_S:
                        # Recorded behind the stream's back: the next chunk is read meanwhile.
                        self.rec.linger(ev.AssistantDelta(**self.rec.e(), text="".join(buf)))
                        buf.clear()
                        last = now
            if buf:
                self.rec.defer(ev.AssistantDelta(**self.rec.e(), text="".join(buf)))
            # A chunk still lingering goes with the response's record (this turn's end, often).
            self.rec.take_lingering()
            return stream.get()

    async def title(self) -> None:
        """Name the session once, serialised with this turn's own model requests."""
        self.titled = True
        t = self.turn
        if self.rec.has_deferred:  # the response it names is in the log before the title is asked for
            await self.rec.emit()
        first = _first_user_text(self.rec.history.messages) or t.text
        req = ModelRequest(parts=[UserPromptPart(content=first)], instructions=TITLE_PROMPT,
                           metadata={"cox_purpose": "title", "cox_vias": ["send"]})
        try:
            async with asyncio.timeout(TITLE_TIMEOUT_S):
                resp = await guarded(t, model_request(self.deps.models.get(t.model), [req]))
        except (StopRequested, LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a failed title never ends the turn
            self.log.info("title.failed", error=logged(exc))
            return
        used = self._usage("title", resp)
        if spending.spends(self._usage_ops):
            await self.rec.emit(used, ops=self._usage_ops)  # a cost is counted before anything else happens
        else:
            # Recorded with the turn's next record (the turn's end, when the response it named was
            # the last: TurnLoop.title): nothing waits on it being in the log before that.
            self.rec.defer(used, ops=self._usage_ops)
        await self.deps.clients.usage_seen(used.model_dump(include=USAGE_SAMPLE))
        title = _clean_title("".join(p.content for p in resp.parts if isinstance(p, TextPart)))
        if not title:
            return
        try:
            await self.deps.store.fns.auto_title(sid=t.sid, token=t.token, owner=self.deps.owner, title=title,
                                                 turn_id=t.turn_id)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc


def raw_finish(response: ModelResponse) -> str | None:
    """The finish reason as the provider sent it (pydantic-ai keeps it in provider_details)."""
    details = response.provider_details or {}
    raw = details.get("finish_reason")
    return str(raw) if raw is not None else response.finish_reason


def _first_user_text(messages: list[Any]) -> str | None:
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and isinstance(p.content, str):
                    return p.content
    return None


def _clean_title(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.strip().strip("\"'`#*").strip()[:80]
