"""Daily spend budgets: ``[limits] session_spend`` and ``principal_spend`` (docs/api.md, "Budgets").

USD per day, the day being the UTC day of Redis's clock. Every model request's cost is counted
where its ``usage`` event is recorded: in the session hash by ``cox_emit``'s ``spend`` op
(``spend_day``, ``spend_today``), and in the principal's own key by ``cox_spend`` right after
(another slot). A turn checks both before each model request and after each response: at
``[limits] warn_at`` of a budget a ``limit.warning`` (once per budget, session and day); at the
budget the turn ends ``spend_limit`` and its ``cox_turn_end`` pauses the session (the waiting
messages stay waiting, sends are 409 ``budget_reached``) until ``cox_budget_resume`` finds the
budget raised. An admin's ``spend_limit`` (PATCH) replaces ``session_spend`` for one session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coxswain.config import LimitsConfig

SESSION = "session_spend"
PRINCIPAL = "principal_spend"


@dataclass
class Today:
    """What the session and its principal spent on ``day`` (USD)."""

    day: int
    session: float
    principal: float


@dataclass(frozen=True)
class Reached:
    """A daily budget reached (or, for a warning, nearly)."""

    budget: str
    limit: float
    spent: float
    day: int
    override: bool = False
    """The session's own ``spend_limit`` (an admin's), not ``[limits] session_spend``."""

    @property
    def detail(self) -> str:
        """What a refused send (409 ``budget_reached``) and the turn's end say."""
        if self.budget == PRINCIPAL:
            return (f"the daily spend budget of this session's owner ([limits] principal_spend, ${self.limit:g}) is "
                    f"reached: ${self.spent:.4f} spent today (UTC) across its sessions; the session is paused "
                    "until an admin raises it (the config, then a reload) or the day ends")
        which = "its spend_limit" if self.override else "[limits] session_spend"
        return (f"the session's daily spend budget ({which}, ${self.limit:g}) is reached: ${self.spent:.4f} spent "
                "today (UTC); the session is paused until an admin raises it (PATCH spend_limit) or the day ends")

    def pause(self) -> str:
        """The JSON ``cox_turn_end`` pauses the session with (the session hash's ``budget``)."""
        return json.dumps({"budget": self.budget, "limit": self.limit, "spent": round(self.spent, 8),
                           "day": self.day, "detail": self.detail})


def session_limit(info: Mapping[str, Any], limits: LimitsConfig) -> tuple[float | None, bool]:
    """The session's daily budget and whether it is its own ``spend_limit`` (an admin's)."""
    raw = info.get("spend_limit")
    if raw not in (None, ""):
        return float(raw), True
    return limits.session_spend, False


def active(info: Mapping[str, Any], limits: LimitsConfig) -> bool:
    """Does any daily budget apply to the session?"""
    return limits.principal_spend is not None or session_limit(info, limits)[0] is not None


def budgets(today: Today, info: Mapping[str, Any], limits: LimitsConfig) -> list[Reached]:
    """Both daily budgets that apply, with what was spent against each."""
    out: list[Reached] = []
    limit, override = session_limit(info, limits)
    if limit is not None:
        out.append(Reached(SESSION, limit, today.session, today.day, override))
    if limits.principal_spend is not None:
        out.append(Reached(PRINCIPAL, limits.principal_spend, today.principal, today.day))
    return out


def reached(today: Today, info: Mapping[str, Any], limits: LimitsConfig) -> Reached | None:
    """The first daily budget reached today, or None."""
    return next((b for b in budgets(today, info, limits) if b.spent >= b.limit), None)


def warnings_due(today: Today, info: dict[str, Any], limits: LimitsConfig) -> tuple[list[Reached], str]:
    """The daily budgets whose spend reached ``warn_at`` of them and were not warned of today, and
    the session's ``spend_warned`` with them marked (``info`` is updated too)."""
    raw = str(info.get("spend_warned") or "")
    day, _, names = raw.partition(":")
    warned = set(names.split(",")) if day == str(today.day) and names else set()
    due = [b for b in budgets(today, info, limits)
           if b.budget not in warned and limits.warn_at * b.limit <= b.spent < b.limit]
    marked = f"{today.day}:{','.join(sorted(warned | {b.budget for b in due}))}"
    if due:
        info["spend_warned"] = marked
    return due, marked


def spend_of(ops: Sequence[tuple[str, str, str, str]]) -> float:
    """USD the ``spend`` ops of one ``cox_emit`` add."""
    return sum(float(v) for op, _, _, v in ops if op == "spend")


def spends(ops: Sequence[tuple[str, str, str, str]]) -> bool:
    """Whether ``ops`` hold a ``spend`` op: its record needs ``cox_emit``'s reply (the day's spend),
    so it cannot wait to be carried by ``cox_turn_end``, which refuses the op."""
    return any(op == "spend" for op, _, _, _ in ops)


async def principal_spend(fns: Any, principal: str, add: float = 0.0) -> tuple[int, float]:
    """Add ``add`` USD to the principal's spend of the day (0: only read it) and answer the day
    (Redis's clock) and what the principal spent on it. One Redis call (``cox_spend``)."""
    got = await fns.spend(principal=principal, add=repr(add) if add else "0")
    return int(got["day"]), float(got["usd"])


async def count_principal(fns: Any, principal: str, cost: float) -> None:
    """Count a cost recorded outside a turn (a person's compaction) in its principal's spend of the day."""
    if cost > 0 and principal:
        await principal_spend(fns, principal, cost)


def over_words(limit: float, usd: float) -> str:
    """Why a send is refused when the principal's budget is reached (not yet any pause)."""
    return Reached(PRINCIPAL, limit, usd, 0).detail


async def principal_over(fns: Any, limits: LimitsConfig, principal: str) -> str:
    """'' when the principal may spend today, else why not (a send's 409 ``budget_reached``).
    One Redis call, only with ``[limits] principal_spend`` set."""
    limit = limits.principal_spend
    if limit is None or not principal:
        return ""
    _, usd = await principal_spend(fns, principal)
    return over_words(limit, usd) if usd >= limit else ""
