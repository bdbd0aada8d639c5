"""A turn's budget: what it has used against its limits. Pure: no I/O, no clock of its own.

The loop asks it before each call and after each model response whether a hard limit is
reached, which soft limits are newly due (a checkpoint the person answers once per limit and
turn), and whether the turn is stuck (the same call returning the same result again and again).
Time spent waiting for the person (approvals, checkpoints) is not work time: it is added to
``waited`` and taken off the elapsed time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from coxswain.config import LimitsConfig

STUCK_WINDOW = 100


@dataclass(frozen=True)
class SoftCheck:
    limit: str
    value: float | int
    soft: float
    hard: float | None


@dataclass(frozen=True)
class WarningDue:
    limit: str
    value: float | int
    of: float


@dataclass
class Budget:
    limits: LimitsConfig
    started: float
    """When the turn started, on the monotonic clock the caller passes to :meth:`elapsed`."""
    tool_calls: int = 0
    actions: int = 0
    tokens: int = 0
    spend: float = 0.0
    waited: float = 0.0
    """Seconds spent waiting for the person: not work time."""
    soft_passed: set[str] = field(default_factory=set)
    warned: set[str] = field(default_factory=set)
    malformed_in_row: int = 0
    repeats: list[str] = field(default_factory=list)

    def elapsed(self, now: float) -> float:
        """Seconds of work so far: wall time minus time spent waiting for the person."""
        return now - self.started - self.waited

    def time_left(self, now: float) -> float:
        return self.limits.seconds - self.elapsed(now)

    def call_limit(self, is_action: bool) -> tuple[str, int] | None:
        """The hard limit a call may not start past (its name and the value reached), if any."""
        if self.tool_calls >= self.limits.tool_calls:
            return "tool_calls", self.tool_calls
        if is_action and self.actions >= self.limits.actions:
            return "actions", self.actions
        return None

    def add_response(self, tokens: int, cost: float) -> None:
        self.tokens += tokens
        self.spend += cost

    def tokens_over(self) -> bool:
        return self.tokens >= self.limits.tokens

    def spend_over(self) -> bool:
        return self.limits.spend is not None and self.spend >= self.limits.spend

    def soft_due(self, now: float) -> list[SoftCheck]:
        """Soft limits reached for the first time this turn (each is then marked passed). A soft
        limit counts only when set lower than its hard one (or for spend, which may be soft only)."""
        values: dict[str, float | int] = {"tool_calls": self.tool_calls, "tokens": self.tokens,
                                          "actions": self.actions, "seconds": self.elapsed(now), "spend": self.spend}
        due: list[SoftCheck] = []
        for name, value in values.items():
            soft = self.limits.soft_value(name)
            hard = self.limits.hard_value(name)
            if name in self.soft_passed or soft is None or value < soft:
                continue
            if hard is not None and soft >= hard:
                continue
            self.soft_passed.add(name)
            due.append(SoftCheck(name, round(value, 6) if isinstance(value, float) else value, soft, hard))
        return due

    def warnings_due(self, now: float) -> list[WarningDue]:
        """Hard limits whose value reached ``[limits] warn_at`` of them for the first time this
        turn (each is then marked warned): the turn is told before the limit stops it."""
        values: dict[str, float | int] = {"tool_calls": self.tool_calls, "tokens": self.tokens,
                                          "actions": self.actions, "seconds": self.elapsed(now), "spend": self.spend}
        due: list[WarningDue] = []
        for name, value in values.items():
            hard = self.limits.hard_value(name)
            if hard is None or name in self.warned or value < self.limits.warn_at * hard or value >= hard:
                continue
            self.warned.add(name)
            due.append(WarningDue(name, round(value, 6) if isinstance(value, float) else value, hard))
        return due

    def stuck(self, name: str, args_json: str, output: str) -> bool:
        """Progress guard: True when the same call returned the same result ``stuck_repeats``
        times in a row."""
        self.repeats.append(_signature(name, args_json, output))
        del self.repeats[:-STUCK_WINDOW]
        return self._stuck(self.repeats)

    def would_stick(self, name: str, args_json: str | Callable[[], str], output: str) -> bool:
        """What :meth:`stuck` will say of this call and output, counting nothing. ``args_json``
        may be a function: it is called (and the output hashed) only when the calls before this
        one could make a run of ``stuck_repeats`` with it."""
        prior = self.repeats[-(self.limits.stuck_repeats - 1):]
        if len(prior) < self.limits.stuck_repeats - 1 or len(set(prior)) != 1:
            return False
        args = args_json if isinstance(args_json, str) else args_json()
        return self._stuck([*prior, _signature(name, args, output)])

    def _stuck(self, repeats: list[str]) -> bool:
        n = self.limits.stuck_repeats
        return len(repeats) >= n and len(set(repeats[-n:])) == 1

    def malformed_round(self, malformed: bool) -> bool:
        """After a tool round: True when the model sent malformed calls in two rounds in a row."""
        self.malformed_in_row = self.malformed_in_row + 1 if malformed else 0
        return self.malformed_in_row >= 2

    def would_fail_round(self, malformed: bool) -> bool:
        """What :meth:`malformed_round` will say of a round, counting nothing."""
        return malformed and self.malformed_in_row + 1 >= 2


def _signature(name: str, args_json: str, output: str) -> str:
    return hashlib.sha256(f"{name}\0{args_json}\0{output}".encode()).hexdigest()
