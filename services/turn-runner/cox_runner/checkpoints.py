"""A turn's limits at its checkpoints (docs/design.md, "The turn loop": limits and soft limits).

The hard ones end the turn ``hard_budget`` (``limit.hard``); a soft limit set lower than its
hard one is a checkpoint: ``limit.soft``, then an approval named ``continue`` the person answers
once per limit and turn (the don't-ask switch answers yes; no ends the turn ``canceled``). Before
a hard limit, at ``[limits] warn_at`` of it, a ``limit.warning`` and a system Lead. The pure
arithmetic is :class:`~cox_runner.budget.Budget`'s; this is what the turn does about it.
"""

from __future__ import annotations

import time

from coxswain import events as ev
from coxswain.models import CallSpec
from coxswain.session_view import spent_on

from . import spending
from .budget import Budget
from .gate import Gate
from .recorder import Recorder
from .turn import Ending, EndTurn, Turn


class Checkpoints:
    def __init__(self, turn: Turn, rec: Recorder, budget: Budget, gate: Gate) -> None:
        self.turn = turn
        self.rec = rec
        self.budget = budget
        self.limits = budget.limits
        self.gate = gate

    def elapsed(self) -> float:
        """Seconds of work so far: wall time minus time spent waiting for the person."""
        return self.budget.elapsed(time.monotonic())

    def check_time(self) -> None:
        if self.elapsed() >= self.limits.seconds:
            raise EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s"))

    async def hard(self, name: str, value: float) -> None:
        """End the turn at a hard limit (the calls not started get their result on the way out)."""
        await self.rec.emit(ev.LimitHard(**self.rec.e(), limit=name, value=value))
        raise EndTurn(Ending("hard_budget", detail=f"hard {name} limit reached ({value:g})"))

    async def warnings(self) -> None:
        """Warn before a hard limit stops the turn: at ``[limits] warn_at`` of it, once per limit
        and turn, a ``limit.warning`` and a system Lead that joins the turn with its next model
        request (a note: unlike a person's Lead it skips none of the calls already asked for)."""
        for w in self.budget.warnings_due(time.monotonic()):
            shown = f"{w.value:g}" if isinstance(w.value, int) else f"{w.value:.4g}"
            await self.rec.emit(ev.LimitWarning(**self.rec.e(), limit=w.limit, value=w.value, of=w.of))
            await self.rec.user_message(
                f"[coxswain] {shown} of {w.of:g} {w.limit.replace('_', ' ')} used in this turn: wrap up, "
                "or say what you need to finish.", f"warn-{w.limit}-{self.turn.turn_id}", "lead", note=True)

    async def daily(self) -> None:
        """The daily budgets (:mod:`cox_runner.spending`), before each model request and after each
        response: at ``warn_at`` of one a ``limit.warning`` and a system Lead (once per budget,
        session and day); reached, the turn ends ``spend_limit`` and the session pauses."""
        t, rec, limits = self.turn, self.rec, self.limits
        if not spending.active(t.info, limits) or not t.info.get("principal"):
            return
        if rec.today is None:  # the turn's first look: today's spend as Redis has it (its clock's day)
            day, usd = await spending.principal_spend(rec.deps.store.fns, str(t.info.get("principal") or ""))
            rec.today = spending.Today(day=day, session=spent_on(t.info, day), principal=usd)
        due, marked = spending.warnings_due(rec.today, t.info, limits)
        for w in due:
            await rec.emit(ev.LimitWarning(**rec.e(), limit=w.budget, value=round(w.spent, 6), of=w.limit),
                           ops=[("hset", "", "spend_warned", marked)])
            await rec.user_message(
                f"[coxswain] ${w.spent:.4f} of the ${w.limit:g} daily {w.budget.replace('_', ' ')} budget used today: "
                "wrap up, or say what you need to finish.", f"warn-{w.budget}-{t.turn_id}", "lead", note=True)
        hit = spending.reached(rec.today, t.info, limits)
        if hit is not None:
            await rec.emit(ev.LimitHard(**rec.e(), limit=hit.budget, value=round(hit.spent, 8)))
            raise EndTurn(Ending("spend_limit", detail=hit.detail, pause=hit.pause()))

    async def soft(self) -> None:
        """A soft limit set lower than its hard one is a checkpoint: the person is asked whether
        the turn goes on (docs/design.md, soft limits). The don't-ask switch answers yes; no
        means ``canceled``."""
        for due in self.budget.soft_due(time.monotonic()):
            name, shown, soft, hard = due.limit, due.value, due.soft, due.hard
            await self.rec.emit(ev.LimitSoft(**self.rec.e(), limit=name, value=shown))
            if (await self.gate.policy_inputs())[1]:  # the don't-ask switch answers yes
                continue
            spec = CallSpec(call_id=f"limit-{name}-{self.turn.turn_id}", name="continue",
                            args={"limit": name, "value": shown, "soft": soft, "hard": hard})
            out = await self.gate.ask_person(spec, None, None, security=False,
                                             reason=f"the soft {name} limit ({soft:g}) is reached; go on?")
            if out.message:
                await self.rec.user_message(out.message, f"{spec.call_id}-msg", "approval")
            if not out.allowed:
                who = "the unattended run declined its checkpoint" if out.actor == "run" else \
                    "the person ended the turn"
                raise EndTurn(Ending("canceled", detail=f"{who} at the soft {name} limit"))
