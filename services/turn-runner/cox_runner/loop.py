"""The turn loop (DESIGN "A turn"): model request, tool calls, safe boundaries, limits, plan.

One :class:`TurnLoop` runs one turn to its end and returns an :class:`Ending`; the drive
(``drive.py``) records it and starts whatever waits next. There is no response-round cap: the
loop runs until the model answers, an error stops progress, a limit ends it, or Stop/steer.

Safe boundaries are after each model response and after each tool call. At a boundary with
Leads pending, the in-flight action has finished; the unstarted calls of the response are
skipped (each still gets a result), the Leads become user messages and the next request goes
out. An approval that is pending stays open while Leads wait (ADR-0067).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
from coxswain import keys, safefs, textdiff
from coxswain.errors import CoxError, Fenced
from coxswain.models import CallSpec, KeepRequest

from . import gate, tools, transcript
from .errors import LeaseLost, StopRequested
from .turn import STOP_OUTCOME, Turn

if TYPE_CHECKING:
    from .service import Runner

T = TypeVar("T")

SYSTEM = (
    "You are a coding agent working in the folder {workspace}. Use the tools to read, write and "
    "run commands there; paths are relative to that folder. Writes go ahead and the previous "
    "content is kept; commands may need approval. Use respond to tell the person something without "
    "ending your turn. For work of several steps, write a plan with plan_write and mark steps with "
    "plan_step. When you are done, answer with a short summary and no tool call."
)
TITLE_PROMPT = "Give this conversation a title of at most five words. Answer with the title only."
DELTA_FLUSH_CHARS = 256
DELTA_FLUSH_S = 0.05


@dataclass
class Ending:
    outcome: str
    finish_reason: str | None = None
    detail: str | None = None


class _EndTurn(Exception):
    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.outcome)
        self.ending = ending


class TurnLoop:
    def __init__(self, runner: Runner, turn: Turn) -> None:
        self.runner = runner
        self.turn = turn
        self.settings = runner.settings
        self.limits = runner.settings.limits
        self.log = runner.log.bind(sid=turn.sid, turn_id=turn.turn_id)
        self.history = transcript.Builder()
        self.plan: dict[str, Any] | None = None
        self.tool_calls = 0
        self.actions = 0
        self.tokens = 0
        self.soft_passed: set[str] = set()
        self.malformed_in_row = 0
        self.repeats: list[str] = []
        self.titled = False
        self._tainted: list[str] = []
        self.pending_user: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ recording
    async def emit(self, *events: ev._Event, ops: list[tuple[str, str, str, str]] | None = None) -> None:
        """Record events (and small state writes) fenced by this turn's token."""
        flat: list[str] = []
        for op in ops or []:
            flat.extend(op)
        try:
            await self.runner.store.call(
                "cox_emit", self.turn.sid,
                [self.turn.sid, self.turn.token, self.runner.owner, str(len(ops or [])), *flat,
                 *(ev.body(e) for e in events)],
            )
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc

    def _e(self) -> dict[str, Any]:
        return {"sid": self.turn.sid, "turn_id": self.turn.turn_id}

    # ------------------------------------------------------------------ control
    async def guarded(self, aw: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested."""
        t = self.turn
        if t.stopping:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise StopRequested(t.stop_reason or "stop")
        task: asyncio.Future[T] = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(t.stop_event.wait())
        try:
            racing: list[asyncio.Future[Any]] = [task, stopper]
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            stopper.cancel()
            raise
        stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise StopRequested(t.stop_reason or "stop")

    # ------------------------------------------------------------------ the turn
    async def run(self) -> Ending:
        try:
            await self._load()
            return await self._loop()
        except _EndTurn as end:
            return end.ending
        except StopRequested as stop:
            return Ending(STOP_OUTCOME.get(stop.reason, "stopped"), detail=f"{stop.reason} requested")

    async def _load(self) -> None:
        """The transcript so far, from the event log (any runner may have written it)."""
        t = self.turn
        await self.runner.store.flush(t.sid)
        evs = await self.runner.read_events(t.sid)
        self.history = transcript.build(evs)
        info = await self.runner.redis.hgetall(keys.session(t.sid))
        t.info = info
        plan_raw = info.get("plan")
        self.plan = json.loads(plan_raw) if plan_raw else None
        if self.plan and self.plan.get("turn_id") != t.turn_id:
            marks = sorted(set(self.plan.get("marks", [])))
            if len(marks) < len(self.plan["steps"]):
                await self.emit(ev.PlanCarried(**self._e(), from_turn=self.plan.get("turn_id") or "",
                                               steps=self.plan["steps"], marks=marks))
            else:
                self.plan = None
        self.titled = bool(info.get("title_source")) or info.get("auto_title") != "1"

    def instructions(self) -> str:
        text = SYSTEM.format(workspace=self.turn.workspace.name or ".")
        if self.plan:
            marks = set(self.plan.get("marks", []))
            lines = [f"{i}. [{'x' if i in marks else ' '}] {s}" for i, s in enumerate(self.plan["steps"], 1)]
            head = ("The plan so far (carried from an unfinished turn; go on from the next unmarked step, "
                    "or rewrite it with plan_write):" if self.plan.get("turn_id") != self.turn.turn_id
                    else "The plan:")
            text += "\n\n" + head + "\n" + "\n".join(lines)
        return text

    async def _loop(self) -> Ending:
        while True:
            self._check_time()
            response = await self._model_step()
            calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
            text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
            finish = response.finish_reason

            if finish == "length":
                await self._skip(calls, "truncated")
                if await self._continue_for_leads():
                    continue
                return Ending("output_limit", finish_reason=finish,
                              detail="the response was cut off by the output limit; its tool calls were not run")

            if not self.titled and text.strip():
                await self._title()

            if not calls:
                if await self._continue_for_leads():
                    continue
                if not text.strip():
                    return Ending("empty", finish_reason=finish, detail="the model gave an empty answer")
                return Ending("completed", finish_reason=finish)

            if self.turn.leads_waiting:
                await self._skip(calls, "lead")
                await self._apply_leads()
                continue

            await self._tool_round(calls)
            if not self.titled:
                await self._title()

    # ------------------------------------------------------------------ model
    async def _model_step(self) -> ModelResponse:
        t = self.turn
        for text, via in self.pending_user:
            self.history.user(text, via)
        self.pending_user.clear()
        messages = self.history.request_messages(self.instructions())
        model = self.runner.models.get(t.model)
        params = ModelRequestParameters(function_tools=list(tools.TOOLS), allow_text_output=True)
        settings = self.runner.models.settings(t.model)
        try:
            response = await self.guarded(self._stream(model, messages, params, settings))
        except (StopRequested, LeaseLost, asyncio.CancelledError, _EndTurn):
            raise
        except CoxError:
            raise
        except Exception as exc:
            self.log.warning("model.failed", error=repr(exc))
            raise _EndTurn(Ending("error", detail=f"model request failed: {exc}")) from exc

        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        usage = {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens}
        self.tokens += response.usage.input_tokens + response.usage.output_tokens
        refs = [ev.ToolCallRef(call_id=c.tool_call_id, name=c.tool_name, args=_args_for_log(c)) for c in calls]
        await self.emit(
            ev.AssistantMsg(**self._e(), text=text, finish_reason=response.finish_reason, usage=usage, tool_calls=refs),
            ops=[("hset", ":open", c.tool_call_id, c.tool_name) for c in calls],
        )
        self.history.assistant(text, [r.model_dump() for r in refs], response.finish_reason)
        if self.tokens >= self.limits.tokens:
            await self._hard("tokens", self.tokens, calls)
        return response

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
                        await self.emit(ev.AssistantDelta(**self._e(), text="".join(buf)))
                        buf.clear()
                        last = now
            if buf:
                await self.emit(ev.AssistantDelta(**self._e(), text="".join(buf)))
            return stream.get()

    async def _title(self) -> None:
        """Name the session once, serialised with this turn's own model requests."""
        self.titled = True
        t = self.turn
        first = _first_user_text(self.history.messages) or t.text
        req = ModelRequest(parts=[UserPromptPart(content=first)], instructions=TITLE_PROMPT,
                           metadata={"cox_purpose": "title", "cox_vias": ["send"]})
        try:
            resp = await self.guarded(model_request(self.runner.models.get(t.model), [req]))
        except (StopRequested, LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a failed title never ends the turn
            self.log.info("title.failed", error=repr(exc))
            return
        title = _clean_title("".join(p.content for p in resp.parts if isinstance(p, TextPart)))
        if not title:
            return
        try:
            await self.runner.store.call("cox_auto_title", t.sid,
                                         [t.sid, t.token, self.runner.owner, title, t.turn_id])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc

    # ------------------------------------------------------------------ tools
    async def _tool_round(self, calls: list[ToolCallPart]) -> None:
        malformed = False
        for i, call in enumerate(calls):
            t = self.turn
            if t.stopping:
                await self._skip(calls[i:], t.skip_reason)
                raise StopRequested(t.stop_reason or "stop")
            if self.tool_calls >= self.limits.tool_calls:
                await self._hard("tool_calls", self.tool_calls, calls[i:])
            if call.tool_name in tools.ACTIONS and self.actions >= self.limits.actions:
                await self._hard("actions", self.actions, calls[i:])
            try:
                await self._soft_checks()
            except StopRequested:
                await self._skip(calls[i:], self.turn.skip_reason)
                raise
            except _EndTurn:
                await self._skip(calls[i:], "limit")
                raise
            try:
                bad = await self._one_call(call)
            except StopRequested:
                await self._skip(calls[i + 1:], self.turn.skip_reason)
                raise
            except _EndTurn:
                await self._skip(calls[i + 1:], "limit")
                raise
            malformed = malformed or bad
            # boundary after each tool call
            if self.turn.leads_waiting and i + 1 < len(calls):
                await self._skip(calls[i + 1:], "lead")
                break
            if self.turn.stopping and i + 1 < len(calls):
                await self._skip(calls[i + 1:], self.turn.skip_reason)
                raise StopRequested(self.turn.stop_reason or "stop")
        if malformed:
            self.malformed_in_row += 1
            if self.malformed_in_row >= 2:
                raise _EndTurn(Ending("error", detail="the model sent a malformed tool call twice in a row"))
        else:
            self.malformed_in_row = 0
        if self.turn.leads_waiting:
            await self._apply_leads()
        self._check_time()

    async def _one_call(self, call: ToolCallPart) -> bool:
        """Run one call to its result. True if the call was malformed."""
        t = self.turn
        try:
            args = call.args_as_dict(raise_if_invalid=True)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed call
            args = None
            problem: str | None = f"arguments are not valid JSON: {exc}"
        else:
            problem = tools.check_args(call.tool_name, args)
        await self.emit(ev.ToolCall(**self._e(), call_id=call.tool_call_id, name=call.tool_name,
                                    args=args if args is not None else _args_for_log(call)))
        self.tool_calls += 1
        if problem is not None:
            await self._result(call, False, f"Error: malformed tool call: {problem}. Send the call again "
                                            "with valid arguments.")
            return True
        assert args is not None
        spec = CallSpec(call_id=call.tool_call_id, name=call.tool_name, args=args)
        try:
            outcome = await self.guarded(gate.decide(self, spec))
        except StopRequested:
            await self._result(call, False, f"Cancelled: the person {_verb(t.stop_reason)} the turn "
                                            "while this call waited for a decision.")
            raise
        except CoxError as exc:
            await self._result(call, False, f"Error: the policy check failed ({exc.detail}); the call was not run.")
            return False
        if not outcome.allowed:
            text = f"Refused: {outcome.reason}." if outcome.actor != "person" else "Denied by the person."
            await self._result(call, False, text)
        else:
            await self._execute(call, spec, outcome)
        if outcome.message:
            self.pending_user.append((outcome.message, "approval"))
            await self.emit(ev.UserMsg(**self._e(), message_id=f"{call.tool_call_id}-msg", text=outcome.message,
                                       via="approval"))
        return False

    async def _execute(self, call: ToolCallPart, spec: CallSpec, outcome: gate.GateOutcome) -> None:
        t = self.turn
        name, args = spec.name, spec.args
        limit = self.settings.runner.output_limit
        root = t.workspace
        try:
            if name == "read_file":
                text = await asyncio.to_thread(tools.read_file, root, outcome.path or args["path"], limit)
                self._taint(text)
                await self._result(call, True, text)
            elif name == "list_dir":
                text = await asyncio.to_thread(tools.list_dir, root, outcome.path or "")
                await self._result(call, True, text)
            elif name == "write_file":
                self.actions += 1
                await self._write(call, outcome.path or args["path"], args["content"])
            elif name == "run_command":
                self.actions += 1
                timeout = float(args.get("timeout_s") or self.settings.runner.command_timeout_s)
                timeout = min(timeout, max(1.0, self.limits.seconds - (time.monotonic() - t.started)))
                try:
                    res = await self.guarded(tools.run_command(root, args["command"], timeout, limit))
                except StopRequested:
                    await self._result(call, False, f"Cancelled: the person {_verb(t.stop_reason)} the turn; "
                                                    "the command was killed.")
                    raise
                self._taint(res.output)
                head = f"exit code {res.exit_code}\n" if res.exit_code is not None else ""
                await self._result(call, res.exit_code == 0 and not res.timed_out, head + res.output)
            elif name == "respond":
                await self.emit(ev.AgentMessage(**self._e(), text=args["text"]))
                await self._result(call, True, "Delivered to the person.")
            elif name == "plan_write":
                await self._plan_write(call, [str(s) for s in args["steps"]])
            elif name == "plan_step":
                await self._plan_step(call, int(args["step"]))
        except (StopRequested, LeaseLost, asyncio.CancelledError, _EndTurn):
            raise
        except CoxError as exc:
            await self._result(call, False, f"Error: {exc.detail}")
        except (OSError, ValueError) as exc:
            await self._result(call, False, f"Error: {exc}")

    async def _write(self, call: ToolCallPart, rel: str, content: str) -> None:
        """Keep the previous content, then write atomically. Never cancelled half-way."""
        t = self.turn
        data = content.encode("utf-8", errors="surrogatepass")
        kept = await self.runner.clients.keep(KeepRequest(
            sid=t.sid, workspace=str(t.workspace), path=rel, token=int(t.token), reason="write",
            turn_id=t.turn_id, call_id=call.tool_call_id,
        ))

        def do_write() -> tuple[int, int]:
            old = safefs.read(t.workspace, rel)
            safefs.write(t.workspace, rel, data)
            return textdiff.counts(old, data)

        await self.runner.ensure_lease(t.sid, t.token)  # a stale runner must not write the file
        added, removed = await asyncio.shield(asyncio.to_thread(do_write))
        await self._result(
            call, True, f"Wrote {rel} ({len(data)} bytes, +{added} -{removed}).",
            extra=[ev.VersionKept(**self._e(), path=kept.path, version_id=kept.version_id, store=kept.store),
                   ev.FileWritten(**self._e(), path=rel, added=added, removed=removed)],
            first=True,
        )

    async def _plan_write(self, call: ToolCallPart, steps: list[str]) -> None:
        self.plan = {"steps": steps, "marks": [], "turn_id": self.turn.turn_id}
        await self.emit(ev.PlanWrite(**self._e(), steps=steps),
                        ops=[("hset", "", "plan", json.dumps(self.plan, ensure_ascii=False))])
        await self._result(call, True, f"Plan of {len(steps)} steps recorded.")

    async def _plan_step(self, call: ToolCallPart, step: int) -> None:
        if not self.plan:
            await self._result(call, False, "Error: there is no plan; write one with plan_write first.")
            return
        if not 1 <= step <= len(self.plan["steps"]):
            await self._result(call, False, f"Error: the plan has steps 1 to {len(self.plan['steps'])}.")
            return
        marks = sorted(set(self.plan.get("marks", [])) | {step})
        self.plan = {**self.plan, "marks": marks}
        await self.emit(ev.PlanStep(**self._e(), step=step),
                        ops=[("hset", "", "plan", json.dumps(self.plan, ensure_ascii=False))])
        await self._result(call, True, f"Step {step} marked done.")

    async def _result(self, call: ToolCallPart, ok: bool, output: str, extra: list[ev._Event] | None = None,
                      first: bool = False) -> None:
        t = self.turn
        if t.observed_waiting:
            t.observed_waiting = False
            try:
                taken = await self.runner.store.call("cox_take_observed", t.sid, [t.sid, t.token, "50"])
            except Fenced as exc:
                raise LeaseLost(str(exc)) from exc
            for raw in taken.get("observed") or []:
                with contextlib.suppress(ValueError):
                    o = json.loads(raw)
                    self.history.observed(o.get("command", ""), o.get("output", ""))
        result = ev.ToolResult(**self._e(), call_id=call.tool_call_id, ok=ok, output=output)
        evs = [*(extra or []), result] if first else [result, *(extra or [])]
        await self.emit(*evs, ops=[("hdel", ":open", call.tool_call_id, "")])
        self.history.tool_return(call.tool_call_id, output, call.tool_name)
        self._progress(call, output)

    async def _skip(self, calls: list[ToolCallPart], reason: str) -> None:
        if not calls:
            return
        evs = [ev.ToolSkipped(**self._e(), call_id=c.tool_call_id, reason=reason) for c in calls]
        await self.emit(*evs, ops=[("hdel", ":open", c.tool_call_id, "") for c in calls])
        for c in calls:
            self.history.tool_return(c.tool_call_id, transcript.skip_text(reason), c.tool_name)

    # ------------------------------------------------------------------ boundaries
    async def _apply_leads(self) -> bool:
        t = self.turn
        t.leads_waiting = False
        try:
            res = await self.runner.store.call("cox_take_leads", t.sid, [t.sid, t.token, self.runner.owner, t.turn_id])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        leads = res.get("leads") or []
        for lead in leads if isinstance(leads, list) else []:
            self.pending_user.append((lead["text"], "lead"))
        return bool(self.pending_user)

    async def _continue_for_leads(self) -> bool:
        """Before the turn's final work: close Lead admission, or apply what was saved in time."""
        t = self.turn
        try:
            res = await self.runner.store.call("cox_close_leads", t.sid, [t.sid, t.token])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        if res.get("closed"):
            return bool(self.pending_user)
        return await self._apply_leads()

    # ------------------------------------------------------------------ limits
    def _check_time(self) -> None:
        elapsed = time.monotonic() - self.turn.started
        if elapsed >= self.limits.seconds:
            raise _EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s"))

    async def _hard(self, name: str, value: float, unstarted: list[ToolCallPart]) -> None:
        """End the turn at a hard limit; calls not started get their result first."""
        await self._skip(unstarted, "limit")
        await self.emit(ev.LimitHard(**self._e(), limit=name, value=value))
        raise _EndTurn(Ending("hard_budget", detail=f"hard {name} limit reached ({value:g})"))

    async def _soft_checks(self) -> None:
        values = {"tool_calls": self.tool_calls, "tokens": self.tokens, "actions": self.actions,
                  "seconds": time.monotonic() - self.turn.started}
        for name, value in values.items():
            soft = self.limits.soft_value(name)
            if name in self.soft_passed or soft >= float(getattr(self.limits, name)) or value < soft:
                continue
            self.soft_passed.add(name)
            await self.emit(ev.LimitSoft(**self._e(), limit=name, value=value))
            spec = CallSpec(call_id=f"limit-{name}", name="continue", args={"limit": name, "value": value})
            dont_ask = (await self.runner.redis.hget(keys.session(self.turn.sid), "dont_ask")) == "1"
            if dont_ask:
                continue
            out = await gate.ask_person(self, spec, None, None, reason=f"soft {name} limit reached ({value:g}); go on?",
                                        security=False)
            if not out.allowed:
                raise _EndTurn(Ending("canceled", detail=f"stopped at the soft {name} limit"))

    def _progress(self, call: ToolCallPart, output: str) -> None:
        """Progress guard: the same call with the same result, again and again, is stuck."""
        sig = hashlib.sha256(f"{call.tool_name}\0{call.args_as_json_str()}\0{output}".encode()).hexdigest()
        self.repeats.append(sig)
        n = self.limits.stuck_repeats
        if len(self.repeats) >= n and len(set(self.repeats[-n:])) == 1:
            raise _EndTurn(Ending("stuck", detail=f"the same call returned the same result {n} times"))

    # ------------------------------------------------------------------ taint
    def _taint(self, text: str) -> None:
        for frag in re.findall(r"[^\s'\"`]{8,}", text)[:500]:
            self._tainted.append(frag[:200])
        del self._tainted[:-2000]

    def tainted_fragments(self) -> list[str]:
        return list(dict.fromkeys(self._tainted))


def _args_for_log(call: ToolCallPart) -> Any:
    try:
        return call.args_as_dict(raise_if_invalid=True)
    except Exception:  # noqa: BLE001
        return call.args if isinstance(call.args, str) else str(call.args)


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


def _verb(reason: str | None) -> str:
    return "steered" if reason == "steer" else "stopped" if reason != "shutdown" else "shut down"
