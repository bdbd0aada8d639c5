"""Fault injection for tests: a Redis function runs, and its reply is lost on the way back.

``COX_FAULT_DROP_REPLY="cox_turn_end:1,cox_emit:3,cox_emit:4"`` makes this runner process run
the 1st attempt of ``cox_turn_end`` (and the 3rd and 4th of ``cox_emit``) in Redis as usual and
then raise :class:`redis.exceptions.ConnectionError` instead of returning its reply: exactly what
a connection reset after Redis ran the call looks like. Attempts are counted per function in
this process, retries included (two entries in a row drop a call's reply and its first retry's).

Only honoured when ``COX_TEST_FAULTS=1`` is set too, so a stray variable cannot break a real
deployment; the runner logs ``fault.injection_on`` (error) at start when it is, and
``fault.injection_ignored`` (warning) when the plan is set without the switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATE_ENV = "COX_TEST_FAULTS"
DROP_ENV = "COX_FAULT_DROP_REPLY"


def parse(spec: str) -> dict[str, set[int]]:
    """``fn:n[,fn:n...]`` -> {fn: {n, ...}}; n counts the function's attempts from 1."""
    plan: dict[str, set[int]] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        fn, sep, n = part.rpartition(":")
        if not sep or not fn.startswith("cox_") or not n.isdigit() or int(n) < 1:
            raise ValueError(f"{DROP_ENV}: {part!r} is not <function>:<attempt> (e.g. cox_turn_end:1)")
        plan.setdefault(fn, set()).add(int(n))
    return plan


class DropReplies:
    """Which replies to drop; asked once per attempt of every function call."""

    def __init__(self, plan: Mapping[str, set[int]] | None = None) -> None:
        self.plan = {fn: set(ns) for fn, ns in (plan or {}).items()}
        self._seen: dict[str, int] = {}
        self.dropped = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], log: Any) -> DropReplies:
        spec = environ.get(DROP_ENV, "")
        if not spec:
            return cls()
        if environ.get(GATE_ENV) != "1":
            log.warning("fault.injection_ignored", detail=f"{DROP_ENV} is set but {GATE_ENV}=1 is not: ignored")
            return cls()
        plan = parse(spec)
        log.error("fault.injection_on", drop_reply={fn: sorted(ns) for fn, ns in plan.items()},
                  detail="test-only fault injection: replies of these Redis calls are dropped")
        return cls(plan)

    def drop(self, fn: str) -> bool:
        """Count one attempt of ``fn``; whether its reply is to be dropped."""
        if fn not in self.plan:
            return False
        n = self._seen.get(fn, 0) + 1
        self._seen[fn] = n
        if n in self.plan[fn]:
            self.dropped += 1
            return True
        return False

    def __bool__(self) -> bool:
        return bool(self.plan)
