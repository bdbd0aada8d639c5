"""The latency phases' repeats (``Counts.latency_repeats``): one figure from several runs, its
spread kept, and ``--compare`` not calling a change inside that spread a regression."""

from __future__ import annotations

from bench import compare, report
from bench.profiles import FULL, QUICK
from bench.stats import merge_repeats, spread_of, summary


def _handoff(seen: list[float], ts: list[float], not_queued: int = 0) -> dict[str, object]:
    return {"n": len(seen), "not_queued": not_queued, "turn_end_to_next_first_output_seen_ms": summary(seen),
            "turn_end_to_next_first_output_ts_ms": summary(ts), "turn_end_to_next_turn_start_ts_ms": summary([0.0])}


def test_each_percentile_is_the_median_of_the_repeats_with_their_lowest_and_highest() -> None:
    runs = [_handoff([1.0, 2.0, 9.0], [1, 2, 3]), _handoff([3.0, 4.0, 5.0], [2, 2, 2], not_queued=1),
            _handoff([2.0, 3.0, 4.0], [1, 3, 5])]
    got = merge_repeats(runs)
    seen = got["turn_end_to_next_first_output_seen_ms"]
    assert seen["p50"] == 3.0  # the repeats' p50s are 2, 4 and 3
    assert seen["spread"]["p50"] == [2.0, 4.0]
    assert seen["n"] == 9 and (seen["min"], seen["max"]) == (1.0, 9.0)
    assert seen["p99"] == sorted(summary(xs)["p99"] for xs in ([1.0, 2.0, 9.0], [3.0, 4.0, 5.0], [2.0, 3.0, 4.0]))[1]
    assert (got["n"], got["not_queued"], got["repeats"]) == (9, 1, 3)  # counts add up
    assert spread_of(got["turn_end_to_next_first_output_seen_ms"], "p50") == [2.0, 4.0]


def test_figures_take_the_median_flags_hold_only_if_every_repeat_held_and_one_repeat_is_returned_as_is() -> None:
    one = {"calls": 200, "per_call_ms": 0.5, "all_ok": True, "refused": {"busy": 1}, "outcome": "completed"}
    runs = [one, {**one, "per_call_ms": 0.9, "refused": {"busy": 2, "closed": 1}},
            {**one, "per_call_ms": 0.6, "all_ok": False, "refused": {}}]
    got = merge_repeats(runs)
    assert got["per_call_ms"] == 0.6 and spread_of(got, "per_call_ms") == [0.5, 0.9]
    assert got["calls"] == 200 and spread_of(got, "calls") is None  # the same in every repeat: no spread
    assert got["all_ok"] is False
    assert got["refused"] == {"busy": 3, "closed": 1}
    assert got["outcome"] == "completed"
    assert merge_repeats([one]) is one
    assert FULL.latency_repeats == 3 and QUICK.latency_repeats == 1


def _floors() -> dict[str, object]:
    part = {"ms": {"p50": 0.5, "p99": 1.0}, "client_cpu_us": 1.0, "server_cpu_us_per_op": {}}
    return {k: part for k in ("http_post", "nats_rr", "redis_cas", "js_publish")}


def test_a_row_carries_its_spread_and_the_ratios_it_gives_and_the_table_shows_them() -> None:
    runs = [_handoff([1.5, 1.6, 1.7], [1, 2, 2]), _handoff([2.5, 2.6, 2.7], [2, 3, 3]),
            _handoff([2.0, 2.1, 2.2], [2, 2, 2])]
    res = {"floors": _floors(), "phases": {"handoff": merge_repeats(runs)}}
    rows = report.rows(res)
    seen = next(r for r in rows if r["figure"] == "turn.end -> next turn's first output seen on SSE p50")
    assert seen["value"] == 2.1 and seen["floor"] == 1.5  # 2 scripts + 1 publish at 0.5 ms
    assert seen["spread"] == [1.6, 2.6] and seen["ratio_spread"] == [1.07, 1.73]
    md = report.markdown({**res, "meta": {"date": "d", "commit": "c", "cpu": "x", "cores": 2, "mem_gb": 1,
                                          "python": "3", "nats_server": "n", "redis_server": "r", "libraries": {},
                                          "command": "c"}, "counts": {"name": "full", "latency_repeats": 3}}, rows)
    assert "| hand-off | turn.end -> next turn's first output seen on SSE p50 | 2.1 (1.6-2.6) | 1.5 | 1.4 (1.07-1.73) |" in md
    assert "ran 3 times, interleaved" in md
    once = report.rows({"floors": _floors(), "phases": {"handoff": runs[0]}})
    assert all("spread" not in r for r in once)


def _row(ratio: float, spread: list[float] | None = None) -> dict[str, object]:
    r: dict[str, object] = {"section": "hand-off", "figure": "p99", "ratio": ratio, "unit": "ms", "value": 1,
                            "floor": 1}
    if spread is not None:
        r["ratio_spread"] = spread
    return r


def test_a_change_inside_the_two_runs_spread_is_not_a_regression_and_one_beyond_it_is() -> None:
    then = {"rows": [_row(2.0, [1.8, 2.3])]}
    inside = compare.compare([_row(2.5, [2.2, 3.0])], then, "then.json")
    assert not inside["regressions"] and [x["figure"] for x in inside["within_spread"]] == ["p99"]
    text = "\n".join(compare.markdown(inside))
    assert "inside the spread of the repeats" in text and "hand-off / p99: 2 -> 2.5 (+25%)" in text
    beyond = compare.compare([_row(2.9, [2.5, 3.1])], then, "then.json")
    assert [x["figure"] for x in beyond["regressions"]] == ["p99"] and not beyond["within_spread"]
    # A committed run of one repeat: its ratio inside this run's range is not a regression either.
    single = compare.compare([_row(2.5, [1.9, 2.8])], {"rows": [_row(2.0)]}, "then.json")
    assert not single["regressions"]
    assert compare.compare([_row(2.5)], {"rows": [_row(2.0)]}, "then.json")["regressions"]
