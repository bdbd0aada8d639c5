"""What ``cox sweep`` says: one result line per run, the progress bar while it goes, and the
summary at the end (pass rate per model, p50/p90 time, tokens and cost per task). Pure but for
the terminal, which is rich's (a dependency of Textual, which ``cox chat`` uses)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from .run import COMPLETED, RUN_END, RUN_START

Event = dict[str, Any]
RESULT_FIELDS = ("id", "model", "session_id", "outcome", "passed", "turns", "tool_calls", "input_tokens",
                 "output_tokens", "cost", "seconds", "exit_code")
"""A result line's fields, in order (``exit_code``: the check's, null without a check)."""


@dataclass
class Tally:
    """What a run's events say, counted as they are read."""

    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    start_ts: int | None = None
    end: Event | None = None

    def add(self, ev: Event) -> None:
        t = ev.get("type")
        if t == "tool.call":
            self.tool_calls += 1
        elif t == "usage":
            self.input_tokens += int(ev.get("input_tokens") or 0)
            self.output_tokens += int(ev.get("output_tokens") or 0)
            self.cost += float(ev.get("cost") or 0.0)
        elif t == RUN_START and self.start_ts is None:
            self.start_ts = int(ev.get("ts") or 0)
        elif t == RUN_END:
            self.end = ev


def result(task_id: str, model: str, session_id: str | None, tally: Tally, session: dict[str, Any] | None,
           exit_code: int | None, has_check: bool, error: str | None = None) -> dict[str, Any]:
    """The result line of one run. ``passed``: the check exited 0 (whatever the run's outcome: a
    run cut by ``max_turns`` may still have done the work), or without a check, the run completed.
    Tokens and cost are the session's totals; ``seconds`` is run.start to run.end by the
    server's clock, so a run a resumed sweep re-attached to is timed whole."""
    run = (session or {}).get("run") or {}
    usage = (session or {}).get("usage") or {}
    end = tally.end or {}
    outcome = end.get("outcome") or run.get("outcome") or ("refused" if error else None)
    seconds = None
    if tally.start_ts is not None and end.get("ts") is not None:
        seconds = round((int(end["ts"]) - tally.start_ts) / 1000, 3)
    passed = (exit_code == 0) if has_check else (outcome == COMPLETED)
    out: dict[str, Any] = {
        "id": task_id, "model": model, "session_id": session_id, "outcome": outcome, "passed": passed,
        "turns": end.get("turns", run.get("turns", 0)), "tool_calls": tally.tool_calls,
        "input_tokens": int(usage.get("input_tokens", tally.input_tokens) or 0),
        "output_tokens": int(usage.get("output_tokens", tally.output_tokens) or 0),
        "cost": round(float(usage.get("cost", tally.cost) or 0.0), 6), "seconds": seconds, "exit_code": exit_code,
    }
    if error:
        out["error"] = error
    return out


# ---------------------------------------------------------------- the summary

def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between the nearest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class ModelSummary:
    model: str
    tasks: int = 0
    passed: int = 0
    p50_s: float | None = None
    p90_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.tasks if self.tasks else 0.0

    def as_json(self) -> dict[str, Any]:
        n = self.tasks or 1
        return {"model": self.model, "tasks": self.tasks, "passed": self.passed, "failed": self.tasks - self.passed,
                "pass_rate": round(self.pass_rate, 4), "p50_seconds": self.p50_s, "p90_seconds": self.p90_s,
                "tokens_per_task": round((self.input_tokens + self.output_tokens) / n, 1),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_per_task": round(self.cost / n, 6), "cost": round(self.cost, 6),
                "outcomes": dict(sorted(self.outcomes.items()))}


def summarize(results: list[dict[str, Any]]) -> list[ModelSummary]:
    """One row per model, in the order the models first appear."""
    rows: dict[str, ModelSummary] = {}
    times: dict[str, list[float]] = {}
    for r in results:
        m = str(r.get("model"))
        row = rows.setdefault(m, ModelSummary(m))
        row.tasks += 1
        row.passed += bool(r.get("passed"))
        row.input_tokens += int(r.get("input_tokens") or 0)
        row.output_tokens += int(r.get("output_tokens") or 0)
        row.cost += float(r.get("cost") or 0.0)
        row.outcomes[str(r.get("outcome"))] += 1
        if r.get("seconds") is not None:
            times.setdefault(m, []).append(float(r["seconds"]))
    for m, row in rows.items():
        row.p50_s, row.p90_s = percentile(times.get(m, []), 0.5), percentile(times.get(m, []), 0.9)
    return list(rows.values())


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


def summary_table(rows: list[ModelSummary], ascii_only: bool = False) -> Table:
    table = Table(title="cox sweep", box=box.ASCII if ascii_only else box.SIMPLE_HEAD, title_justify="left")
    for name in ("model", "tasks", "passed", "pass rate", "p50", "p90", "tokens/task", "cost/task", "cost",
                 "outcomes"):
        table.add_column(name, justify="left" if name in ("model", "outcomes") else "right")
    for r in rows:
        n = r.tasks or 1
        table.add_row(r.model, str(r.tasks), str(r.passed), f"{r.pass_rate:.0%}", _s(r.p50_s), _s(r.p90_s),
                      f"{(r.input_tokens + r.output_tokens) / n:,.0f}", f"${r.cost / n:.4f}", f"${r.cost:.4f}",
                      " ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items())))
    return table


# ---------------------------------------------------------------- progress

class View:
    """Progress on stderr: a live bar on a terminal (done, running, passed, failed, tokens, cost,
    ETA), else one line per finished run."""

    def __init__(self, console: Console, total: int, before: list[dict[str, Any]]) -> None:
        self.console = console
        self.running = 0
        self.passed = sum(1 for r in before if r.get("passed"))
        self.failed = len(before) - self.passed
        self.tokens = sum(int(r.get("input_tokens") or 0) + int(r.get("output_tokens") or 0) for r in before)
        self.cost = sum(float(r.get("cost") or 0.0) for r in before)
        self.done, self.total = len(before), total
        self.bar: Progress | None = None
        self.task: TaskID | None = None
        if console.is_terminal:
            self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[line]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                console=console, transient=False)
            self.task = self.bar.add_task("sweep", total=total, completed=self.done, line=self.line())
            self.bar.start()

    def line(self) -> str:
        return (f"running {self.running}  passed {self.passed}  failed {self.failed}  "
                f"tokens {self.tokens:,}  ${self.cost:.4f}")

    def _redraw(self, advance: int = 0) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=advance, line=self.line())

    def started(self) -> None:
        self.running += 1
        self._redraw()

    def finished(self, res: dict[str, Any], ran: bool = True) -> None:
        self.running -= ran
        self.done += 1
        self.passed += bool(res.get("passed"))
        self.failed += not res.get("passed")
        self.tokens += int(res.get("input_tokens") or 0) + int(res.get("output_tokens") or 0)
        self.cost += float(res.get("cost") or 0.0)
        if self.bar is not None:
            self._redraw(1)
        else:
            verdict = "passed" if res.get("passed") else "failed"
            self.console.print(f"[{self.done}/{self.total}] {res['id']} {res['model']} {verdict} "
                               f"{res.get('outcome')} {_s(res.get('seconds'))} {res.get('turns')} turns "
                               f"{res.get('tool_calls')} tool calls ${float(res.get('cost') or 0):.4f}",
                               highlight=False, markup=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
