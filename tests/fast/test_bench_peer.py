"""The peers' figures from their run logs, and their rows beside ours in the report."""

from __future__ import annotations

from typing import Any

from bench import compare, report
from bench.peer import PEERS, peer_rows
from bench.peer.base import MESSAGES, queue_figures
from bench.peer.dbos import run_log


def log_of(times: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """A run log of (marker, start, end) runs, in the order given."""
    return [e for m, s, t in times for e in ({"marker": m, "ev": "start", "t": s}, {"marker": m, "ev": "end", "t": t})]


def runs(start: float = 100.0, gap: float = 0.01) -> list[tuple[str, float, float]]:
    """MESSAGES runs of 20 ms, one after another with ``gap`` between them."""
    return [(f"m{j}", start + j * (0.02 + gap), start + j * (0.02 + gap) + 0.02) for j in range(MESSAGES)]


def test_ordered_runs_count_with_their_hand_offs_and_queue_waits() -> None:
    created = {"a": {f"m{j}": 99.99 for j in range(MESSAGES)}}
    f = queue_figures({"a": log_of(runs())}, created, [(["a"], 99.99)], cpu_s=0.5)
    assert f["verdict"] == {"fifo": True, "no_overlap": True, "complete": True, "ok": True}
    assert f["runs"] == MESSAGES and f["runs_per_s_counted"] == f["runs_per_s"] > 0
    assert f["handoff_end_to_start_ms"]["n"] == MESSAGES - 1 and f["handoff_end_to_start_ms"]["p50"] == 10.0
    assert f["queue_wait_ms"]["min"] == 10.0 and f["cpu_ms_per_run"] == 100.0


def test_rounds_count_their_own_spans_not_the_time_between_them() -> None:
    """S=10 x 5 runs in rounds on fresh sessions, as our side: each round's span runs from its
    first post to its last end, and the time between rounds (the next round's set-up) is nobody's."""
    created = {"a": {f"m{j}": 99.99 for j in range(MESSAGES)}, "b": {f"m{j}": 199.99 for j in range(MESSAGES)}}
    logs = {"a": log_of(runs(100.0)), "b": log_of(runs(200.0))}
    f = queue_figures(logs, created, [(["a"], 99.99), (["b"], 199.99)], cpu_s=1.0)
    one = runs(100.0)[-1][2] - 99.99
    assert f["runs"] == 2 * MESSAGES and f["verdict"]["ok"]
    assert f["runs_per_s"] == round(2 * MESSAGES / (2 * one), 1), f
    assert f["cpu_ms_per_run"] == 100.0 and f["handoff_end_to_start_ms"]["n"] == 2 * (MESSAGES - 1)


def test_runs_out_of_order_or_overlapping_or_missing_count_zero() -> None:
    created: dict[str, dict[str, float]] = {"a": {}}
    swapped = runs()
    swapped[1], swapped[2] = (swapped[2][0], *swapped[1][1:]), (swapped[1][0], *swapped[2][1:])
    f = queue_figures({"a": log_of(swapped)}, created, [(["a"], 99.0)], 0.1)
    assert not f["verdict"]["fifo"] and f["verdict"]["no_overlap"] and f["runs_per_s_counted"] == 0.0
    overlap = sorted(log_of(runs(gap=-0.01)), key=lambda e: e["t"])
    f = queue_figures({"a": overlap}, created, [(["a"], 99.0)], 0.1)
    assert not f["verdict"]["no_overlap"] and f["runs_per_s_counted"] == 0.0
    f = queue_figures({"a": log_of(runs()[:-1])}, created, [(["a"], 99.0)], 0.1)
    assert not f["verdict"]["complete"] and f["runs_per_s_counted"] == 0.0


def test_a_dbos_run_log_is_in_time_order_and_leaves_out_a_workflow_that_did_not_finish() -> None:
    wf: list[dict[str, Any]] = [{"marker": "m1", "start": 2.0, "end": 3.0}, {"marker": "m0", "start": 1.0, "end": 2.0},
          {"marker": "old", "start": None, "end": None}]
    assert [(e["marker"], e["ev"]) for e in run_log(wf)] == [("m0", "start"), ("m0", "end"), ("m1", "start"),
                                                             ("m1", "end")]


def peer_result() -> dict[str, Any]:
    q = {"threads": 10, "runs_per_s_counted": 20.0, "handoff_end_to_start_ms": {"p50": 90.0, "p99": 900.0},
         "queue_wait_ms": {"p99": 2000.0}, "cpu_ms_per_run": 30.0, "verdict": {"ok": True}}
    return {"versions": {"x": "1.0"}, "settings": {"queue_polling_interval_s": 0.01}, "queue": [q],
            "interrupt": {"post_to_new_run_start_ms": {"p50": 40.0, "p99": 60.0}, "no_overlap": True}}


def ours_result() -> dict[str, Any]:
    q = {"turns_per_s_counted": 80.0, "handoff_end_to_first_output_ms": {"p50": 5.0, "p99": 30.0},
         "queue_wait_ms": {"p99": 400.0}, "cpu_ms_per_turn": 20.0, "verdict": {"ok": True}}
    return {"queue": [q], "steer": {"post_to_new_turn_start_ts_ms": {"p50": 3.0, "p99": 8.0}, "no_overlap": True}}


def test_each_peer_gets_its_own_section_and_langgraph_keeps_the_figures_committed_runs_know() -> None:
    rs = peer_rows({"langgraph": peer_result(), "dbos": peer_result(), "ours": ours_result()})
    sections = {r["section"] for r in rs}
    assert sections == {"peer", "peer dbos"} and all(compare.is_peer(s) for s in sections)
    lg = [r["figure"] for r in rs if r["section"] == "peer"]
    assert lg == [r["figure"] for r in rs if r["section"] == "peer dbos"]
    assert "S=10 x 5 runs/s (counted)" in lg and "steer vs interrupt: POST -> new run start p50" in lg
    rate = next(r for r in rs if r["section"] == "peer dbos" and r["unit"] == "runs/s")
    assert rate["ratio"] == 4.0 and "DBOS True" in rate["note"]
    assert not peer_rows({"dbos": peer_result()}), "no rows without our side"


def test_a_peers_rate_falling_is_a_regression_in_its_own_section() -> None:
    before = {"rows": [{"section": "peer dbos", "figure": "S=10 x 5 runs/s (counted)", "ratio": 4.0, "unit": "runs/s"}]}
    now = [{"section": "peer dbos", "figure": "S=10 x 5 runs/s (counted)", "ratio": 2.0, "unit": "runs/s"}]
    assert compare.compare(now, before, "then.json")["regressions"]


def test_the_report_has_one_table_per_peer_titled_with_what_ran() -> None:
    res = {"phases": {"peer": {"dbos": peer_result(), "ours": ours_result()}}}
    rs = peer_rows(res["phases"]["peer"])
    text = "\n".join(report.peer_tables(res, rs))
    assert f"## Peer, side by side: {PEERS['dbos'].label} (x 1.0, queue_polling_interval_s = 0.01)" in text
    assert "| figure | coxswain | DBOS | coxswain / DBOS | unit | note |" in text
    assert "LangGraph" not in text
    assert report.largest(rs) is None, "a peer's ratio is no distance to a floor"


def floor_op(client_us: float, server_us: float) -> dict[str, Any]:
    return {"ms": {"p50": 0.1, "p99": 0.2}, "client_cpu_us": client_us, "server_cpu_us_per_op": {"server": server_us}}


def test_our_side_of_the_peers_load_is_held_to_the_floor_of_such_a_run_and_the_goal_to_what_that_floor_allows() -> None:
    # HTTP 100 µs (the app's), NATS req-reply 300, a Redis script 200, a JetStream publish 300:
    # a run of 3 tool calls needs 100 + 300 + 3 x 200 + 3 x (200 + 300) = 2.5 ms at least.
    f = {"http_post": floor_op(90, 100), "nats_rr": floor_op(100, 200), "redis_cas": floor_op(100, 100),
         "js_publish": floor_op(100, 200)}
    ours = ours_result()
    ours["queue"][0].update(sessions=10, events_per_turn=22.0, cpu_ms_per_turn=5.0)
    lg = peer_result()
    lg["queue"][0]["runs_per_s"] = 100.0
    res: dict[str, Any] = {"meta": {**META, "cores": 2}, "counts": {"name": "full"}, "floors": f,
                           "phases": {"peer": {"langgraph": lg, "ours": ours}}}
    rs = [r for r in report.rows(res) if r["section"] == "peers' load"]
    cpu, goal = rs
    assert (cpu["value"], cpu["floor"], cpu["ratio"]) == (5.0, 2.5, 2.0)
    # 10x LangGraph's 100 runs/s against 2 cores / 2.5 ms = 800 runs/s: beyond what the floor allows
    assert (goal["value"], goal["floor"], goal["ratio"]) == (1000.0, 800.0, 1.25)
    assert not compare.is_peer("peers' load"), "a floor's column, not a peer's"
    assert "| peers' load | S=10 10x LangGraph's runs/s" in report.markdown(res, report.rows(res))
    assert report.largest(rs) is None, "the goal's distance to a ceiling is no distance of ours to a floor"


META = {"date": "d", "commit": "c", "cpu": "c", "mem_gb": 1, "python": "3", "nats_server": "n", "redis_server": "r", "libraries": {},
        "command": "x"}
