"""``./dev bench --compare``: which ratios count as grown, across the rows' kinds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import compare, report


def row(section: str, figure: str, ratio: float, unit: str = "ms") -> dict[str, object]:
    return {"section": section, "figure": figure, "ratio": ratio, "unit": unit, "value": 1, "floor": 1}


def test_a_ratio_grown_past_twenty_percent_is_a_regression_and_one_within_is_not() -> None:
    before = {"rows": [row("send", "p50", 2.0), row("tool calls", "per call", 2.0), row("lead", "p50", 2.0)]}
    now = [row("send", "p50", 2.5), row("tool calls", "per call", 2.3), row("lead", "p50", 1.0)]
    cmp = compare.compare(now, before, "then.json")
    assert [(r["figure"], r["change"]) for r in cmp["regressions"]] == [("p50", 0.25)]
    assert [r["regressed"] for r in cmp["rows"]] == [True, False, False]
    assert cmp["rows"][2]["change"] == -0.5
    text = "\n".join(compare.markdown(cmp))
    assert "1 ratio(s) grew by more than 20%" in text and "send / p50: 2 -> 2.5 (+25% worse)" in text


def test_a_peer_rate_is_better_larger_and_a_peer_cost_worse_larger() -> None:
    before = {"rows": [row("peer", "S=10 runs/s", 4.0, "runs/s"), row("peer", "S=10 CPU per run", 0.5, "ms")]}
    now = [row("peer", "S=10 runs/s", 2.0, "runs/s"), row("peer", "S=10 CPU per run", 0.9, "ms")]
    cmp = compare.compare(now, before, "then.json")
    assert [r["figure"] for r in cmp["regressions"]] == ["S=10 runs/s", "S=10 CPU per run"]
    faster = compare.compare([row("peer", "S=10 runs/s", 8.0, "runs/s")], before, "then.json")
    assert not faster["rows"][0]["regressed"]


def test_a_figure_lost_from_a_measured_section_counts_and_an_unmeasured_section_is_only_named() -> None:
    before = {"rows": [row("sweep", "S=10 turns/s", 1.2), row("sweep", "S=100 turns/s", 1.3),
                       row("peer", "S=10 runs/s", 4.0, "runs/s")]}
    cmp = compare.compare([row("sweep", "S=10 turns/s", 1.2)], before, "then.json")
    assert [(r["figure"], r["ratio"]) for r in cmp["regressions"]] == [("S=100 turns/s", None)]
    assert cmp["not_measured"] == ["peer"]
    assert "Not measured in this run: peer." in "\n".join(compare.markdown(cmp))


def test_the_default_is_the_newest_committed_full_run_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    last = compare.last_committed()
    assert last is not None and last.exists() and "-" not in last.stem
    assert compare.load(last)["counts"]["name"] == "full"
    (tmp_path / "x.json").write_text(json.dumps({"no": "rows"}))
    with pytest.raises(ValueError, match="not a bench result"):
        compare.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="not a bench result"):
        compare.load(tmp_path / "missing.json")


def test_a_run_of_some_phases_is_never_named_as_a_full_run(tmp_path: Path) -> None:
    """``--only`` with full counts once wrote ``<date>.json``, the name ``--compare`` takes for the
    last full run: a later comparison would have set a whole run beside two phases."""

    last = compare.last_committed()
    assert last is not None
    res = compare.load(last)
    res["meta"]["date"] = "2026-12-04T11:09:30"
    partial, _ = report.write(json.loads(json.dumps(res)), tmp_path, None, partial=True)
    whole, _ = report.write(json.loads(json.dumps(res)), tmp_path, None)
    quick, _ = report.write({**json.loads(json.dumps(res)), "counts": {**res["counts"], "name": "quick"}}, tmp_path,
                            None, partial=True)
    assert (partial.name, whole.name, quick.name) == ("20261204T110930-only.json", "20261204T110930.json",
                                                      "20261204T110930-quick.json")


def _floor(p50: float, p99: float) -> dict[str, object]:
    return {"ms": {"p50": p50, "p99": p99}, "client_cpu_us": 1.0, "server_cpu_us_per_op": {}}


def test_the_send_row_against_the_chained_floor_is_there_only_when_that_floor_was_measured() -> None:
    parts = {k: _floor(0.25, 0.5) for k in ("http_post", "nats_rr", "redis_cas", "js_publish")}
    send = {"post_to_202_ms": {"p50": 3.0, "p99": 6.0}, "post_to_turn_start_seen_ms": {"p50": 4.0, "p99": 7.0},
            "post_to_turn_start_ts_ms": {"p50": 1.0, "p99": 2.0}}
    without = report.rows({"floors": parts, "phases": {"send": send}})
    assert not [r for r in without if "chained" in r["figure"]]
    with_chain = report.rows({"floors": {**parts, "send_chain": _floor(1.5, 2.0)}, "phases": {"send": send}})
    chained = {r["figure"]: r for r in with_chain if "chained" in r["figure"]}
    assert set(chained) == {"POST -> 202 (turn started) p50, against the chained floor",
                            "POST -> 202 (turn started) p99, against the chained floor"}
    p50 = chained["POST -> 202 (turn started) p50, against the chained floor"]
    assert (p50["value"], p50["floor"], p50["ratio"]) == (3.0, 1.5, 2.0)
    summed = next(r for r in with_chain if r["figure"] == "POST -> 202 (turn started) p50")
    assert summed["floor"] == 0.75  # the sum of the parts stays as it was: runs compare across commits


def test_the_send_row_against_the_paced_floor_names_the_pace_and_the_sends_own_gap() -> None:
    parts = {k: _floor(0.25, 0.5) for k in ("http_post", "nats_rr", "redis_cas", "js_publish")}
    send = {"post_to_202_ms": {"p50": 3.0, "p99": 6.0}, "post_to_turn_start_seen_ms": {"p50": 4.0, "p99": 7.0},
            "post_to_turn_start_ts_ms": {"p50": 1.0, "p99": 2.0}, "between_ms": {"p50": 3.3}}
    hot = report.rows({"floors": {**parts, "send_chain_fastapi": _floor(1.0, 1.5)}, "phases": {"send": send}})
    assert not [r for r in hot if "pace" in r["figure"]]  # an older run's floors: no such row
    paced = {**_floor(1.5, 3.0), "pace_ms": 3.0}
    rs = report.rows({"floors": {**parts, "send_chain_fastapi": _floor(1.0, 1.5), "send_chain_fastapi_paced": paced},
                      "phases": {"send": send}})
    at_pace = {r["figure"]: r for r in rs if r["figure"].endswith("at the sends' pace")}
    p99 = at_pace["POST -> 202 (turn started) p99, against the FastAPI chained floor at the sends' pace"]
    assert (p99["value"], p99["floor"], p99["ratio"]) == (6.0, 3.0, 2.0)
    assert "3.0 ms after the last reply" in p99["note"] and "3.3 ms after the last 202" in p99["note"]
    hot_p99 = next(r for r in rs if r["figure"] == "POST -> 202 (turn started) p99, against the FastAPI chained floor")
    assert (hot_p99["floor"], hot_p99["ratio"]) == (1.5, 4.0)  # the back-to-back floor's row stays beside it


def test_a_different_machine_is_named_with_how_the_interpreters_floor_moved() -> None:
    def result(cpu: str, py_us: float | None) -> dict[str, object]:
        floors = {"python": {"ms": {"p50": 0.02}, "client_cpu_us": py_us}} if py_us is not None else {}
        return {"meta": {"cpu": cpu, "cores": 2}, "floors": floors, "rows": [row("send", "p50", 2.0)]}

    then = result("Intel(R) Xeon(R) Processor", 20.0)
    moved = compare.compare([row("send", "p50", 3.0)], then, "then.json", result("AMD EPYC", 30.0))
    assert moved["machine"] == {"now": "AMD EPYC x 2", "then": "Intel(R) Xeon(R) Processor x 2", "same": False,
                                "python_us_now": 30.0, "python_us_then": 20.0, "python_change": 0.5,
                                "floors_change": {}}
    text = "\n".join(compare.markdown(moved))
    assert "**A different machine**" in text and "20 -> 30 µs/op (+50%)" in text
    assert moved["rows"][0]["regressed"]  # still listed: the note explains, it does not excuse

    same = compare.compare([row("send", "p50", 2.0)], then, "then.json", result("Intel(R) Xeon(R) Processor", None))
    assert same["machine"]["same"] and same["machine"]["python_change"] is None
    text = "\n".join(compare.markdown(same))
    assert text.count("Same machine (Intel(R) Xeon(R) Processor x 2)") == 1 and "was not measured in both runs" in text


def test_one_cpu_name_over_two_generations_is_two_machines() -> None:
    """A VM reported "AMD EPYC" on a first-generation EPYC and on a fourth: the interpreter's
    floor went 25.8 -> 8.9 µs/op and ``--compare`` said "Same machine"."""
    def result(py_us: float, cpu_id: str | None) -> dict[str, object]:
        m: dict[str, object] = {"cpu": "AMD EPYC", "cores": 2, **({"cpu_id": cpu_id} if cpu_id else {})}
        return {"meta": m, "floors": {"python": {"client_cpu_us": py_us}}, "rows": [row("send", "p50", 2.0)]}

    by_id = compare.machine(result(8.9, "family 25 model 17"), result(25.8, "family 23 model 1"))
    assert not by_id["same"] and by_id["now"] == "AMD EPYC (family 25 model 17) x 2"
    by_floor = compare.machine(result(8.9, "family 25 model 17"), result(25.8, None))  # an older run: name only
    assert not by_floor["same"] and by_floor["then"] == "AMD EPYC x 2"
    rerun = compare.machine(result(9.4, "family 25 model 17"), result(8.9, "family 25 model 17"))
    assert rerun["same"], "a quiet rerun on one host moves the floor by a few percent"
    text = "\n".join(compare.markdown(compare.compare([row("send", "p50", 2.0)], result(25.8, None), "then.json",
                                                       result(8.9, "family 25 model 17"))))
    assert "**A different machine**" in text and "25.8 -> 8.9 µs/op (-66%)" in text


def test_the_last_committed_run_is_the_one_committed_last_whatever_its_name(tmp_path: Path) -> None:
    """A VM's clock jumped back between two runs: the run committed last was named hours before
    the one it followed, and ``--compare`` set this run beside the older one."""

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    git("init", "-q")
    for name in ("20261204T114807.json", "20261204T110930-only.json", "20261204T114034.json"):
        (results / name).write_text("{}")
        git("add", ".")
        git("commit", "-qm", name)
    assert compare.last_committed(results) == tmp_path / "bench" / "results" / "20261204T114034.json"
    (results / "20261205T000000.json").write_text("{}")  # not committed: not a committed run
    assert compare.last_committed(results) == tmp_path / "bench" / "results" / "20261204T114034.json"
    git("rm", "-q", "bench/results/20261204T114034.json")
    git("commit", "-qm", "gone")
    assert compare.last_committed(results) == tmp_path / "bench" / "results" / "20261204T114807.json"


def test_server_floors_that_moved_between_the_runs_are_named() -> None:
    """Two full runs of one commit on one VM an hour apart saw the C servers' floors move up to
    20% with the interpreter's floor within 2%: "Same machine", but not the same host speed."""
    def result(rr: float, js: float) -> dict[str, object]:
        floors = {"python": {"client_cpu_us": 9.0}, "nats_rr": {"ms": {"p50": rr}}, "js_publish": {"ms": {"p50": js}}}
        return {"meta": {"cpu": "AMD EPYC", "cores": 2, "cpu_id": "family 25 model 17"}, "floors": floors,
                "rows": [row("send", "p50", 2.0)]}

    moved = compare.compare([row("send", "p50", 2.0)], result(0.28, 0.37), "then.json", result(0.33, 0.38))
    assert moved["machine"]["same"] and moved["machine"]["floors_change"] == {"nats_rr": 0.179, "js_publish": 0.027}
    text = "\n".join(compare.markdown(moved))
    assert "**The servers' floors moved** between the two runs (nats_rr +18%, js_publish +3%)" in text
    quiet = compare.compare([row("send", "p50", 2.0)], result(0.28, 0.37), "then.json", result(0.29, 0.37))
    text = "\n".join(compare.markdown(quiet))
    assert "The servers' floors (p50): nats_rr +4%, js_publish +0%." in text and "moved**" not in text


def _memory(**extra: object) -> dict[str, object]:
    return {"sessions": 100, "rss_mb_after": {}, "rss_kb_per_session": {}, "redis_bytes_per_session": 969.0,
            "redis_session_fields_bytes": 190.5, "redis_session_keys_bytes": 344,
            "after_one_turn": {"redis_session_keys_bytes": 600, "redis_session_fields_bytes": 368,
                               "jetstream_bytes_per_turn": 2219.6},
            "jetstream_bytes_per_session": 360, **extra}


def test_redis_bytes_per_session_are_held_to_the_fields_stored_compactly_once_that_floor_is_measured() -> None:
    floors = {**{k: _floor(0.25, 0.5) for k in ("http_post", "nats_rr", "redis_cas", "js_publish")},
              "rss_mb": {"asgi-app": 30.0, "responder": 40.0}}

    def redis_rows(m: dict[str, object]) -> dict[str, dict[str, object]]:
        rows = report.rows({"floors": floors, "phases": {"memory": m}})
        return {r["figure"]: r for r in rows if r["figure"].startswith("Redis bytes")}

    # #23 item 4: "≤ 2x the floor of its fields (encodings that fit Redis's compact types)": the
    # floor is those fields in one hash, measured on the server; their raw bytes are named beside it.
    measured = redis_rows(_memory(redis_idle_bytes_per_session=603.0, redis_floor_bytes_per_session=489.0,
                                  redis_parts_bytes_per_session={"tx_replies": 232.0, "tx_keys_per_session": 1.0,
                                                                 "principal_index": 129.3, "active_indexes": 40.3}))
    idle = measured["Redis bytes per idle session (used_memory delta, transition replies expired)"]
    created = measured["Redis bytes per session just created (used_memory delta)"]
    assert (idle["value"], idle["floor"], idle["ratio"]) == (603.0, 489.0, 1.23)
    assert (created["value"], created["floor"], created["ratio"]) == (969.0, 489.0, 1.98)
    assert "190.5 B" in str(idle["note"]) and "232.0 B of transition replies" in str(created["note"])
    # A run without that floor (an older result) keeps the one row, against the raw bytes.
    (only,) = redis_rows(_memory()).values()
    assert (only["floor"], only["ratio"]) == (190.5, 5.09)


def test_the_handoff_rows_against_the_chained_floor_stand_beside_the_summed_ones() -> None:
    parts = {k: _floor(0.25, 0.5) for k in ("http_post", "nats_rr", "redis_cas", "js_publish")}
    handoff = {"turn_end_to_next_first_output_ts_ms": {"p50": 2.0, "p99": 4.0},
               "turn_end_to_next_first_output_seen_ms": {"p50": 1.5, "p99": 3.0},
               "turn_end_to_next_turn_start_ts_ms": {"p50": 0.0, "p99": 0.0}}
    older = report.rows({"floors": parts, "phases": {"handoff": handoff}})
    assert not [r for r in older if "chained" in r["figure"]]  # a run before the chain was measured
    rs = report.rows({"floors": {**parts, "handoff_chain": _floor(1.25, 2.0)}, "phases": {"handoff": handoff}})
    chained = {r["figure"]: r for r in rs if "chained" in r["figure"]}
    assert set(chained) == {f"turn.end -> next turn's first output {q}, against the chained floor" for q in ("p50", "p99")} | {
        f"turn.end -> next turn's first output seen on SSE {q}, against the chained floor" for q in ("p50", "p99")}
    seen99 = chained["turn.end -> next turn's first output seen on SSE p99, against the chained floor"]
    assert (seen99["value"], seen99["floor"], seen99["ratio"]) == (3.0, 2.0, 1.5)
    ts50 = chained["turn.end -> next turn's first output p50, against the chained floor"]
    assert (ts50["value"], ts50["floor"], ts50["ratio"]) == (2.0, 1.25, 1.6)
    summed = next(r for r in rs if r["figure"] == "turn.end -> next turn's first output p99")
    assert (summed["floor"], summed["ratio"]) == (1.5, 2.67)  # 2 scripts + 1 publish, as in the runs before
