"""``cox sweep``'s result lines, summary and progress lines without a server."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from cox.sweep_report import RESULT_FIELDS, Tally, View, percentile, result, summarize, summary_table


def events() -> list[dict[str, Any]]:
    return [
        {"seq": 1, "type": "session.created", "ts": 900},
        {"seq": 2, "type": "run.start", "ts": 1000, "confirm": "yolo", "unattended": True, "max_turns": 5},
        {"seq": 3, "type": "tool.call", "ts": 1100, "call_id": "c1", "name": "run_command", "args": {}},
        {"seq": 4, "type": "usage", "ts": 1150, "input_tokens": 10, "output_tokens": 4, "cost": 0.5},
        {"seq": 5, "type": "tool.call", "ts": 1200, "call_id": "c2", "name": "write_file", "args": {}},
        {"seq": 6, "type": "run.end", "ts": 3500, "outcome": "max_turns", "turns": 5},
    ]


def tally() -> Tally:
    t = Tally()
    for ev in events():
        t.add(ev)
    return t


SESSION = {"id": "s_1", "run": {"state": "ended", "turns": 5, "outcome": "max_turns"},
           "usage": {"requests": 3, "input_tokens": 30, "output_tokens": 12, "cache_read_tokens": 0,
                     "cache_write_tokens": 0, "cost": 0.25}}


def test_a_result_line_has_the_contract_fields_and_the_check_decides_passed() -> None:
    r = result("t1", "script", "s_1", tally(), SESSION, 0, has_check=True)
    assert tuple(r) == RESULT_FIELDS
    assert r == {"id": "t1", "model": "script", "session_id": "s_1", "outcome": "max_turns", "passed": True,
                 "turns": 5, "tool_calls": 2, "input_tokens": 30, "output_tokens": 12, "cost": 0.25,
                 "seconds": 2.5, "exit_code": 0}
    assert result("t1", "script", "s_1", tally(), SESSION, 1, has_check=True)["passed"] is False
    # without a check, a run passes when it completed
    assert result("t1", "script", "s_1", tally(), SESSION, None, has_check=False)["passed"] is False
    done = Tally()
    done.add({"type": "run.end", "ts": 1, "outcome": "completed", "turns": 1})
    assert result("t1", "script", "s_1", done, SESSION, None, has_check=False)["passed"] is True
    # a check that could not run is a failure, with the reason
    broken = result("t1", "script", "s_1", tally(), SESSION, None, has_check=True, error="check: not_found: x")
    assert broken["passed"] is False and broken["error"] == "check: not_found: x"


def test_a_refused_start_is_a_result_too() -> None:
    r = result("t2", "script", None, Tally(), None, None, has_check=True, error="not_found: no workspace repo")
    assert r["outcome"] == "refused" and r["passed"] is False and r["session_id"] is None
    assert r["seconds"] is None and r["turns"] == 0 and r["error"] == "not_found: no workspace repo"


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 0.5) is None
    assert percentile([4.0], 0.9) == 4.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert abs((percentile([float(x) for x in range(1, 11)], 0.9) or 0) - 9.1) < 1e-9


def test_the_summary_has_a_row_per_model_with_rates_times_tokens_and_cost() -> None:
    rows = [
        {"model": "a", "passed": True, "seconds": 1.0, "input_tokens": 100, "output_tokens": 20, "cost": 0.1,
         "outcome": "completed"},
        {"model": "b", "passed": False, "seconds": None, "input_tokens": 0, "output_tokens": 0, "cost": 0.0,
         "outcome": "refused"},
        {"model": "a", "passed": False, "seconds": 3.0, "input_tokens": 50, "output_tokens": 30, "cost": 0.3,
         "outcome": "max_turns"},
    ]
    a, b = summarize(rows)
    assert a.as_json() == {"model": "a", "tasks": 2, "passed": 1, "failed": 1, "pass_rate": 0.5, "p50_seconds": 2.0,
                           "p90_seconds": 2.8, "tokens_per_task": 100.0, "input_tokens": 150, "output_tokens": 50,
                           "cost_per_task": 0.2, "cost": 0.4, "outcomes": {"completed": 1, "max_turns": 1}}
    assert (b.model, b.tasks, b.pass_rate, b.p50_s) == ("b", 1, 0.0, None)
    out = Console(file=io.StringIO(), width=140, color_system=None)
    out.print(summary_table([a, b], ascii_only=True))
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "pass rate" in text and "50%" in text and "2.0s" in text and "2.8s" in text and "$0.2000" in text
    assert "completed 1 max_turns 1" in text and "refused 1" in text
    assert text.isascii()


def test_without_a_terminal_progress_is_a_line_per_finished_run() -> None:
    buf = io.StringIO()
    view = View(Console(file=buf, width=200, color_system=None), 3,
                [{"passed": True, "input_tokens": 1, "output_tokens": 1, "cost": 0.5}])
    assert view.bar is None and (view.done, view.passed, view.failed) == (1, 1, 0)
    view.started()
    view.finished(result("t2", "script", "s_2", tally(), SESSION, 3, has_check=True))
    view.close()
    assert (view.done, view.running, view.passed, view.failed, view.tokens) == (2, 0, 1, 1, 44)
    assert buf.getvalue() == "[2/3] t2 script failed max_turns 2.5s 5 turns 2 tool calls $0.2500\n"
    assert "running 0  passed 1  failed 1  tokens 44  $0.7500" == view.line()


def test_on_a_terminal_progress_is_a_bar() -> None:
    buf = io.StringIO()
    view = View(Console(file=buf, width=160, force_terminal=True, color_system=None), 2, [])
    assert view.bar is not None
    view.started()
    view.finished(result("t1", "script", "s_1", tally(), SESSION, 0, has_check=True))
    view.close()
    assert "1/2" in buf.getvalue() and "passed 1" in buf.getvalue() and "ETA" in buf.getvalue()
