"""The results: ``bench/results/<date>.json`` and the tables of ``bench/RESULTS.md``.

Every figure is one row: value, the floor measured in the same run, and value / floor (for a
throughput, ideal / measured), so a ratio of 1.0 is the floor and larger is further from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import floors
from .compare import is_peer
from .latency import LEAD_MODEL_MS
from .peer import PEERS
from .peer.base import QUEUE_TARGET
from .stats import ratio, spread_of

HERE = Path(__file__).resolve().parent


def _row(section: str, figure: str, value: Any, floor: Any, unit: str, note: str = "",
         inverse: bool = False, spread: list[float] | None = None) -> dict[str, Any]:
    """One figure. ``spread``: the lowest and highest of the phase's repeats (the value is their
    median), kept with the ratios they give (``ratio_spread``) for ``--compare``."""
    r = ratio(floor, value) if inverse else ratio(value, floor)
    row = {"section": section, "figure": figure, "value": value, "floor": floor, "unit": unit, "ratio": r,
           "note": note}
    if spread is not None:
        lo, hi = (ratio(floor, x) if inverse else ratio(x, floor) for x in spread)
        row["spread"] = spread
        row["ratio_spread"] = sorted([lo, hi]) if lo is not None and hi is not None else None
    return row


def _r(x: Any, d: int = 3) -> Any:
    return round(x, d) if isinstance(x, float) else x


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if sb := res.get("phases", {}).get("sandbox"):
        for q in ("p50", "p99"):
            out.append(_row("sandbox", f"`true` in bwrap, per command {q}", sb["bwrap"][q], sb["bare"][q], "ms",
                            "floor = the same command bare (mode none), same code path, alternated"))
    if ch := res.get("phases", {}).get("chat"):  # its floor is its own first turns
        w, n = ch["window"], ch["turns"]
        out.append(_row("chat", f"CPU per turn at turns {n - w + 1}-{n} of a session, against turns 1-{w}",
                        ch["late_cpu_ms_per_turn"], ch["early_cpu_ms_per_turn"], "ms",
                        f"all stack processes; {ch['sessions']} sessions, each message sent when the last turn ended "
                        f"(a drive per turn); ~{ch['events_per_session']} events a session at the end; "
                        "'floor' = the same session's first turns: a turn's start must not cost more as its log grows"))
        out.append(_row("chat", f"runners' CPU per turn at turns {n - w + 1}-{n}, against turns 1-{w}",
                        ch["late_runner_cpu_ms_per_turn"], ch["early_runner_cpu_ms_per_turn"], "ms", "the runners alone"))
    f = res.get("floors")
    if not f:
        return out + list(res.get("peer_rows") or [])
    c = {q: floors.composite(f, q) for q in ("p50", "p99")}
    ph = res.get("phases", {})
    if s := ph.get("send"):
        for q in ("p50", "p99"):
            out.append(_row("send", f"POST -> 202 (turn started) {q}", s["post_to_202_ms"][q], _r(c[q]["send"]), "ms",
                            "client clock; floor = HTTP POST + NATS req-reply + Redis script",
                            spread=spread_of(s["post_to_202_ms"], q)))
            if (chained := stat_or_none(f, "send_chain", q)) is not None:
                out.append(_row("send", f"POST -> 202 (turn started) {q}, against the chained floor",
                                s["post_to_202_ms"][q], chained, "ms",
                                "floor = one request through the same hops and processes (HTTP -> bare ASGI app -> "
                                "NATS request -> responder -> Redis script -> back), nothing of ours in between",
                                spread=spread_of(s["post_to_202_ms"], q)))
            if (fchained := stat_or_none(f, "send_chain_fastapi", q)) is not None:
                out.append(_row("send", f"POST -> 202 (turn started) {q}, against the FastAPI chained floor",
                                s["post_to_202_ms"][q], fchained, "ms",
                                "floor = the same chain through a FastAPI app that writes the send route as any "
                                "would (path pattern, bearer dependency, validated body and reply)",
                                spread=spread_of(s["post_to_202_ms"], q)))
            if (paced := stat_or_none(f, "send_chain_fastapi_paced", q)) is not None:
                pace = f["send_chain_fastapi_paced"].get("pace_ms")
                gap = (s.get("between_ms") or {}).get("p50")
                out.append(_row("send", f"POST -> 202 (turn started) {q}, against the FastAPI chained floor at the "
                                "sends' pace", s["post_to_202_ms"][q], paced, "ms",
                                f"floor = the same FastAPI chain, each request {pace} ms after the last reply, as the "
                                f"sends come (here a POST {gap} ms after the last 202, p50, the turn run between); "
                                "on a VM a request after a pause waits for sleeping processes and idle or "
                                "packed vCPUs at every hop, which a floor made back to back never does "
                                "(ANALYSIS.md)", spread=spread_of(s["post_to_202_ms"], q)))
            out.append(_row("send", f"POST -> turn.start seen on SSE {q}", s["post_to_turn_start_seen_ms"][q],
                            _r(c[q]["send_seen"]), "ms", "client clock; floor adds one JetStream publish",
                            spread=spread_of(s["post_to_turn_start_seen_ms"], q)))
            out.append(_row("send", f"POST -> turn.start ts {q}", s["post_to_turn_start_ts_ms"][q], _r(c[q]["send"]),
                            "ms", "server ts (1 ms resolution) - client wall clock",
                            spread=spread_of(s["post_to_turn_start_ts_ms"], q)))
    if t := ph.get("tool_calls"):
        out.append(_row("tool calls", f"per call, (turn - tool) / {t['calls']}", t["per_call_ms"],
                        _r(c["p50"]["tool_call"]), "ms", "floor = 1 Redis script + 1 JetStream publish (p50)",
                        spread=spread_of(t, "per_call_ms")))
        out.append(_row("tool calls", "per call, marginal (one-call turn taken off)", t["marginal_per_call_ms"],
                        _r(c["p50"]["tool_call"]), "ms", "same floor", spread=spread_of(t, "marginal_per_call_ms")))
        if "per_step_ms" in t:
            out.append(_row("tool calls", f"per step, one call per response, (turn - tool) / {t['calls']}",
                            t["per_step_ms"], _r(c["p50"]["tool_call"]), "ms",
                            "each call its own model request, record and publish (reads in one response "
                            "are recorded as a group); same floor", spread=spread_of(t, "per_step_ms")))
    if le := ph.get("lead"):
        for q in ("p50", "p99"):
            out.append(_row("lead", f"POST -> lead.applied seen {q}", le["post_to_lead_applied_seen_ms"][q],
                            _r(c[q]["lead"]), "ms",
                            "client clock; includes waiting for the in-flight step; "
                            "floor = HTTP + NATS req-reply + 2 Redis scripts",
                            spread=spread_of(le["post_to_lead_applied_seen_ms"], q)))
            out.append(_row("lead", f"lead.saved -> lead.applied ts {q}", le["lead_saved_to_applied_ts_ms"][q],
                            _r(c[q]["lead"]), "ms", "server ts",
                            spread=spread_of(le["lead_saved_to_applied_ts_ms"], q)))
            if (b := le.get("boundary_to_lead_applied_seen_ms")) and b.get(q) is not None:
                out.append(_row("lead", f"boundary -> lead.applied seen {q}", b[q], _r(c[q]["lead_boundary"]), "ms",
                                "client clock (µs): arrivals of the in-flight action's last event (its result, or "
                                "the response) and of lead.applied; the wait for that action is a step's own time "
                                "(tool calls); floor = 1 Redis script + 1 JetStream publish", spread=spread_of(b, q)))
    if (lm := ph.get("lead_model")) and (b := lm.get("boundary_to_lead_applied_seen_ms")):
        for q in ("p50", "p99"):
            if b.get(q) is not None:
                out.append(_row("lead", f"boundary -> lead.applied seen {q}, the model {LEAD_MODEL_MS} ms a response", b[q],
                                _r(c[q]["lead_boundary"]), "ms",
                                f"as above, each response {LEAD_MODEL_MS} ms of the model's time: the Lead lands while the model "
                                "answers, as it mostly does with a real one, and goes with the response's record",
                                spread=spread_of(b, q)))
    if h := ph.get("handoff"):
        for q in ("p50", "p99"):
            out.append(_row("hand-off", f"turn.end -> next turn's first output {q}",
                            h["turn_end_to_next_first_output_ts_ms"][q], _r(c[q]["handoff"]), "ms",
                            "server ts; zero-delay model; floor = 2 Redis scripts + 1 JetStream publish",
                            spread=spread_of(h["turn_end_to_next_first_output_ts_ms"], q)))
            if (seen := h.get("turn_end_to_next_first_output_seen_ms")) and seen.get(q) is not None:
                out.append(_row("hand-off", f"turn.end -> next turn's first output seen on SSE {q}", seen[q],
                                _r(c[q]["handoff"]), "ms",
                                "client clock (µs): the two events' arrivals on the session's stream; same floor",
                                spread=spread_of(seen, q)))
            if (chained := stat_or_none(f, "handoff_chain", q)) is not None:
                # Beside the summed floor (kept as it was: runs compare across commits), the same
                # operations measured as one chain (bench/floor/probe.py handoff_chain).
                out.append(_row("hand-off", f"turn.end -> next turn's first output {q}, against the chained floor",
                                h["turn_end_to_next_first_output_ts_ms"][q], chained, "ms",
                                "server ts; floor = one program doing a hand-off's I/O back to back (script, "
                                "publish not awaited, script, publish, acks) on the same servers, nothing of ours "
                                "in between", spread=spread_of(h["turn_end_to_next_first_output_ts_ms"], q)))
                if seen and seen.get(q) is not None:
                    out.append(_row("hand-off", f"turn.end -> next turn's first output seen on SSE {q}, against the "
                                    "chained floor", seen[q], chained, "ms", "client clock (µs); the same chained floor",
                                    spread=spread_of(seen, q)))
            out.append(_row("hand-off", f"turn.end -> next turn.start {q}", h["turn_end_to_next_turn_start_ts_ms"][q],
                            _r(stat_or_none(f, "redis_cas", q)), "ms", "server ts; one atomic script",
                            spread=spread_of(h["turn_end_to_next_turn_start_ts_ms"], q)))
    for p in ph.get("sweep") or []:
        if "error" in p:
            out.append(_row("sweep", f"runners={p['runners']} S={p['sessions']}", None, None, "", p["error"]))
            continue
        tag = f"runners={p['runners']} S={p['sessions']}"
        if p.get("servers", "single") != "single":
            tag = f"{p['servers']} {tag}"
        ok = "FIFO+no-overlap kept" if p["verdict"]["ok"] else f"BROKEN: {p['verdict']['problems'][:2]}"
        sr = p["verdict"].get("short_reads") or {}
        if sr.get("short_reads"):
            ok += (f"; {sr['short_reads']} event-log reads came back short and were retried "
                   f"({sr.get('still_short', 0)} still short)")
        out.append(_row("sweep", f"{tag} turns/s", p["turns_per_s_counted"], p["ideal"]["turns_per_s"], "turns/s",
                        f"{ok}; floor = min(S / model time, cores / CPU floor per turn) = "
                        f"min({p['ideal']['model_bound_turns_per_s']:.0f}, {p['ideal']['cpu_bound_turns_per_s']:.0f}); "
                        "ratio = floor / measured", inverse=True))
        d = p.get("dispositions", {})
        out.append(_row("sweep", f"{tag} p99 queue wait", p["queue_wait_ms"].get("p99"),
                        p["ideal"]["queue_wait_p99_ms"], "ms",
                        f"floor = the turns ahead at the floor's pace; {d.get('queued', 0)} of "
                        f"{sum(d.values())} messages were queued (the rest found the session idle)"))
        sw = p.get("switches_per_turn")
        woke = (f"; {sw['voluntary']} wake-ups and {sw['involuntary']} preemptions a turn over all processes "
                "(context switches)") if sw else ""
        out.append(_row("sweep", f"{tag} CPU per turn", p["cpu_ms_per_turn"], p["cpu_floor_ms_per_turn"], "ms",
                        f"all stack processes; client {p['client_cpu_ms_per_turn']} ms/turn apart; floor = CPU of "
                        f"HTTP + NATS req-reply + 3 Redis scripts + {p['events_per_turn']} JetStream publishes{woke}"))
    for p in ph.get("runs") or []:
        tag = f"runners={p['runners']} tasks={p['tasks']}"
        if "error" in p:
            out.append(_row("runs", tag, None, None, "", p["error"]))
            continue
        ok = "every run completed" if p["ok"] else f"NOT ALL COMPLETED: {p['outcomes']}, {p['refused']} refused"
        out.append(_row("runs", f"{tag} tasks/s", p["tasks_per_s_counted"], p["ideal"]["turns_per_s"], "tasks/s",
                        f"{ok}; POST /v1/runs, unattended yolo, one 50 ms turn each, [runs] max_active = 8; "
                        f"floor = min(8 / model time, cores / CPU floor per turn); ratio = floor / measured",
                        inverse=True))
        out.append(_row("runs", f"{tag} CPU per task", p["cpu_ms_per_task"], p["cpu_floor_ms_per_task"], "ms",
                        f"all stack processes; floor as the sweep's, {p['events_per_task']} events per task"))
        out.append(_row("runs", f"{tag} interactive send -> turn.start p99 during the runs",
                        p["interactive_during_ms"].get("p99"), p["interactive_idle_ms"].get("p99"), "ms",
                        "server ts - client clock; 'floor' = the same send on the idle stack just before"))
    for cmp in ph.get("sweep_cluster_vs_single") or []:
        tag = f"runners={cmp['runners']} S={cmp['sessions']}"
        what = "+".join(k for k, v in (cmp.get("clustered") or {}).items() if v) or "none"
        out.append(_row("cluster", f"{tag} turns/s, cluster vs single", cmp["turns_per_s"]["cluster"],
                        cmp["turns_per_s"]["single"], "turns/s",
                        f"clustered: {what}; 'floor' = the same point on single servers; ratio = single / cluster",
                        inverse=True))
        out.append(_row("cluster", f"{tag} CPU per turn, cluster vs single", cmp["cpu_ms_per_turn"]["cluster"],
                        cmp["cpu_ms_per_turn"]["single"], "ms",
                        "all stack processes, every server node included; ratio = cluster / single"))
    if m := ph.get("memory"):
        n = m["sessions"]
        for name, mb in m["rss_mb_after"].items():
            fl = f["rss_mb"]["asgi-app"] if name == "gateway" else (
                f["rss_mb"]["responder"] if name not in ("nats-server", "redis-server") else None)
            out.append(_row("memory", f"RSS {name} after {n} sessions", mb, fl, "MB",
                            f"{m['rss_kb_per_session'].get(name, 0)} KB/session; floor = bare floor process"))
        if m.get("up_ready_s"):
            out.append(_row("memory", "cox up start -> ready (2 runners, servers running)", m["up_ready_s"], None, "s",
                            "the services are forks of cox up's fork server, which imports them once"))
        if rs := m.get("runner_start"):
            for kind, how in (("fresh", "a fresh interpreter (python -m cox_runner: the images, COX_UP_FORK=0)"),
                              ("fork", "a fork of a fork server with the runner imported (cox up)")):
                out.append(_row("memory", f"runner start -> serving, {kind}, p50", rs[f"{kind}_s"].get("p50"), None,
                                "s", f"{how}; into the running stack; {rs['tries']} tries, max "
                                     f"{rs[f'{kind}_s'].get('max')} s"))
                if rss := rs.get(f"{kind}_rss_mb"):
                    out.append(_row("memory", f"runner RSS serving, no turn run yet, {kind}, p50", rss.get("p50"),
                                    60.0 if kind == "fresh" else None, "MB",
                                    "read 1 s after serving; fresh: 'floor' = #23's goal, 60 MB (the turn machinery, "
                                    "pydantic-ai, is imported at the first turn)" if kind == "fresh" else
                                    "read 1 s after serving; counts the pages shared with the fork server, which has "
                                    "the turn machinery imported (PSS below is the share)"))
        if ti := (rs or {}).get("turns_import_s"):
            out.append(_row("memory", "a fresh runner's first turn: the turn machinery's import, p50", ti.get("p50"),
                            None, "s", "cox_runner.loop after cox_runner.service in a fresh interpreter; a runner "
                                       "imports it off its event loop when its first drive starts"))
        for name, mb in m.get("pss_mb_after", {}).items():
            if name.startswith(("turn-runner", "gateway")):
                fl = f["rss_mb"]["asgi-app"] if name == "gateway" else f["rss_mb"]["responder"]
                out.append(_row("memory", f"PSS {name} after {n} sessions", mb, fl, "MB",
                                "shared pages divided among the processes that share them (the services are forks "
                                "of cox up's fork server); floor = the bare floor process's RSS"))
        raw = m["redis_session_fields_bytes"]
        if "redis_idle_bytes_per_session" in m:
            # #23 item 4's floor is "the floor of its fields" in Redis's compact types: the same
            # fields in one hash and one owner-index entry, measured on the same server. Their
            # raw bytes (no key, no header, no index) are no floor a store can reach: shown apart.
            pt, fl = m["redis_parts_bytes_per_session"], m["redis_floor_bytes_per_session"]
            out.append(_row("memory", "Redis bytes per idle session (used_memory delta, transition replies expired)",
                            m["redis_idle_bytes_per_session"], fl, "B",
                            "floor = measured on the same server: the same fields in one hash and one owner-index "
                            f"entry per session (their raw bytes alone: {raw} B); of ours, principal index "
                            f"{pt['principal_index']} B, activity indexes {pt['active_indexes']} B"))
            out.append(_row("memory", "Redis bytes per session just created (used_memory delta)",
                            m["redis_bytes_per_session"], fl, "B",
                            f"same floor; the idle figure + {pt['tx_replies']} B of transition replies "
                            f"({pt['tx_keys_per_session']} a session, kept 60 s for a retried call)"))
        else:
            out.append(_row("memory", "Redis bytes per idle session (used_memory delta)", m["redis_bytes_per_session"],
                            raw, "B", "floor = bytes of the session's fields and values"))
        out.append(_row("memory", "Redis MEMORY USAGE of a session's keys", m["redis_session_keys_bytes"],
                        m["redis_session_fields_bytes"], "B", "sample of 200"))
        a = m["after_one_turn"]
        out.append(_row("memory", "Redis MEMORY USAGE of a session's keys after one turn",
                        a["redis_session_keys_bytes"], a["redis_session_fields_bytes"], "B", ""))
        out.append(_row("memory", "JetStream bytes per session (created)", m["jetstream_bytes_per_session"], None,
                        "B", f"{a['jetstream_bytes_per_turn']} B per echo turn"))
    if (cp := ph.get("compose")) and "serving_s" in cp:
        out.append(_row("memory", "docker compose up -d (1 runner) -> serving", cp["up_s"], None, "s",
                        f"{cp['compose']} on the local images (cached); every service a fresh interpreter in "
                        f"its container"))
        out.append(_row("memory", "compose up --scale turn-runner=N+1 -> the new runner serving, p50",
                        cp["serving_s"].get("p50"), None, "s",
                        f"N = 1..{cp['adds']}, max {cp['serving_s'].get('max')} s; of which the command itself "
                        f"(container created and started) p50 {cp['command_s'].get('p50')} s"))
    out.extend(_peer_run_rows(res, f))
    out.extend(res.get("peer_rows") or [])
    return out


PEER_RUN = "peers' load"
"""Our side of the peers' load against the floor of such a run, and #23's goal against what that
floor allows on this machine (not a peer's section: the floor column is a floor)."""


def _peer_run_rows(res: dict[str, Any], f: dict[str, Any]) -> list[dict[str, Any]]:
    peer = (res.get("phases") or {}).get("peer") or {}
    ours = (peer.get("ours") or {}).get("queue") or []
    if not ours:
        return []
    cores = (res.get("meta") or {}).get("cores") or 1
    floor_ms = floors.run_cpu_floor(f, QUEUE_TARGET)
    ceiling = cores * 1000.0 / floor_ms
    out = []
    for oq in ours:
        n = oq["sessions"]
        out.append(_row(PEER_RUN, f"S={n} CPU per run, against the floor of a run of {QUEUE_TARGET} tool calls",
                        oq["cpu_ms_per_turn"], _r(floor_ms), "ms",
                        f"ours: every stack process, the peers' load ({oq['events_per_turn']} events a run); floor = "
                        f"HTTP + NATS req-reply + 3 Redis scripts + {QUEUE_TARGET} x (1 Redis script + 1 JetStream "
                        "publish), nothing for the model's output"))
        # #23's goal names LangGraph's server: 10x its runs/s at S=10 and S=100.
        p = PEERS["langgraph"]
        pq = next((q for q in (peer.get("langgraph") or {}).get("queue") or [] if q.get("threads") == n), None)
        if pq and pq.get("runs_per_s"):
            goal = round(10 * pq["runs_per_s"], 1)
            out.append(_row(PEER_RUN, f"S={n} 10x {p.column}'s runs/s (#23's goal), against the most that floor allows "
                            f"on {cores} cores", goal, round(ceiling, 1), "runs/s",
                            f"ceiling = {cores} cores / {floor_ms:.2f} ms (the floor above); ratio > 1: beyond what "
                            f"the floor's own CPU allows here; ours measured {oq['turns_per_s_counted']} runs/s at "
                            f"{oq['cpu_ms_per_turn']} ms a run, {p.column} {pq['runs_per_s']} at {pq['cpu_ms_per_run']} "
                            f"ms a run"))
    return out


def stat_or_none(f: dict[str, Any], kind: str, q: str) -> float | None:
    try:
        return floors.stat(f, kind, q)
    except KeyError:
        return None


def largest(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
    scored = [r for r in rs if isinstance(r.get("ratio"), (int, float)) and r["section"] not in ("memory", "cluster", PEER_RUN)
              and not is_peer(r["section"])]
    return max(scored, key=lambda r: r["ratio"]) if scored else None


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _spread(v: Any, spread: Any) -> str:
    """A value with the lowest and highest of its repeats: ``2.41 (2.2-2.6)``."""
    if not isinstance(spread, list) or len(spread) != 2 or None in spread or spread[0] == spread[1]:
        return _fmt(v)
    return f"{_fmt(v)} ({_fmt(spread[0])}-{_fmt(spread[1])})"


def markdown(res: dict[str, Any], rs: list[dict[str, Any]]) -> str:
    meta = res["meta"]
    lines = [f"# coxswain benchmark results ({res['counts']['name']} run)", ""]
    if meta.get("loaded"):
        lines += [f"**Measured on a loaded machine** (load average {meta['loadavg_start']} at start, "
                  f"{meta.get('loadavg_end')} at the end, on {meta['cores']} cores shared with other work): "
                  "treat every figure as an upper bound; re-run on a quiet machine for real numbers.", ""]
    lines += ["## Machine and versions", "", f"- date: {meta['date']}; commit {meta['commit']}",
              f"- CPU: {meta['cpu']}{' (' + meta['cpu_id'] + ')' if meta.get('cpu_id') else ''} x "
              f"{meta['cores']} cores; memory {meta['mem_gb']} GB",
              f"- Python {meta['python']}; {meta['nats_server']}; {meta['redis_server']}",
              "- libraries: " + ", ".join(f"{k} {v}" for k, v in meta["libraries"].items()),
              f"- command: `{meta['command']}`; elapsed {res.get('elapsed_s')} s", ""]
    f = res.get("floors")
    if f:
        lines += ["## Floors (same run, same servers)", "", "| floor | p50 ms | p99 ms | client CPU µs/op | server CPU µs/op |",
                  "|---|---|---|---|---|"]
        for k, v in f.items():
            if isinstance(v, dict) and "ms" in v:
                lines.append(f"| {k} | {v['ms']['p50']} | {v['ms']['p99']} | {v['client_cpu_us']} | "
                             f"{', '.join(f'{n} {c}' for n, c in v['server_cpu_us_per_op'].items())} |")
        lines.append("")
    lines += ["## Figures", ""]
    repeats = (res.get("counts") or {}).get("latency_repeats") or 1
    if repeats > 1:
        lines += [f"The latency phases (send, tool calls, Lead, hand-off) ran {repeats} times, interleaved: each of "
                  "their values is the median of the repeats', the lowest and highest in brackets (and the ratios "
                  "they give).", ""]
    lines += ["| section | figure | value | floor | ratio | unit | note |", "|---|---|---|---|---|---|---|"]
    for r in rs:
        if is_peer(r["section"]):
            continue
        lines.append(f"| {r['section']} | {r['figure']} | {_spread(r['value'], r.get('spread'))} | "
                     f"{_fmt(r['floor'])} | {_spread(r['ratio'], r.get('ratio_spread'))} | {r['unit']} | {r['note']} |")
    lines.append("")
    lines += peer_tables(res, rs)
    big = largest(rs)
    if big:
        lines += [f"**Largest ratio to the floor:** {big['section']} / {big['figure']}: {_fmt(big['value'])} "
                  f"{big['unit']} against {_fmt(big['floor'])} ({_fmt(big['ratio'])}x).", ""]
    if res.get("errors"):
        lines += ["## Phases that failed", ""] + [f"- {k}: `{v.strip().splitlines()[-1]}`" for k, v in
                                                   res["errors"].items()] + [""]
    prof = res.get("profile")
    if prof and prof.get("processes"):
        lines += ["## Profile of the hottest path (py-spy, the 200-call turn)", ""]
        for name, s in prof["processes"].items():
            if not s.get("samples"):
                continue
            lines.append(f"- **{name}** ({s['samples']} samples at {prof.get('rate', 250)} Hz): self time by package: " +
                         ", ".join(f"{k} {v}%" for k, v in s["package_self_pct"][:8]))
            lines.append("  - our code, inclusive: " + "; ".join(f"{k} {v}%" for k, v in s["ours_inclusive_pct"][:12]))
            lines.append("  - hottest frames, self: " + "; ".join(f"{k} {v}%" for k, v in s["self_pct"][:8]))
        lines.append("")
    tr = res.get("traces") or {}
    if any(isinstance(v, dict) and v.get("lines") for v in tr.values()):
        lines += ["## Wire timelines (every Redis command and NATS message, one operation each)", "",
                  "`redis<name` is a command from that process (Lua's inner calls are not listed); "
                  "`nats` is any message on the bus (requests, replies `_INBOX`, JetStream API `$JS`, "
                  "event publishes `cox.ev`). A large gap with nothing on the wire is time inside a process.", ""]
        for name, t in tr.items():
            if not isinstance(t, dict) or not t.get("lines"):
                continue
            shown = t["lines"] if len(t["lines"]) <= 70 else [*t["lines"][:60], "...", *t["lines"][-8:]]
            lines += [f"### {name}: {t['what']} ({t['window_ms']} ms)", "", "```", *shown, "```", ""]
    lines += ["## Reading", "", "Where the time goes, for the committed full run: `bench/ANALYSIS.md` (written by hand "
              "from that run's profile and wire timelines).", ""]
    if res.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in res["notes"]] + [""]
    return "\n".join(lines)


def peer_tables(res: dict[str, Any], rs: list[dict[str, Any]]) -> list[str]:
    """One table per peer measured: its rows, what ran (versions, settings) in the title."""
    lines: list[str] = []
    measured = res.get("phases", {}).get("peer") or {}
    for name, peer in PEERS.items():
        mine = [r for r in rs if r["section"] == peer.section]
        if not mine:
            continue
        got = measured.get(name) or {}
        what = [f"{k} {v}" for k, v in (got.get("versions") or {}).items()]
        what += [f"{k} = {v}" for k, v in (got.get("settings") or {}).items()]
        them = peer.column
        lines += [f"## Peer, side by side: {peer.label} ({', '.join(what)})", "",
                  f"| figure | coxswain | {them} | coxswain / {them} | unit | note |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['figure']} | {_fmt(r['value'])} | {_fmt(r['floor'])} | {_fmt(r['ratio'])} | {r['unit']} | "
                  f"{r['note']} |" for r in mine]
        lines.append("")
    return lines


def write(res: dict[str, Any], out_dir: Path, results_md: Path | None, partial: bool = False) -> tuple[Path, str]:
    """The run's JSON (``<date>.json`` for a full run, the one ``--compare`` takes; ``-quick`` for
    quick counts, ``-only`` for full counts of some phases) and its table, also to ``results_md``."""
    rs = rows(res)
    res["rows"] = rs
    big = largest(rs)
    res["largest_ratio"] = big
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = res["meta"]["date"].replace(":", "").replace("-", "")[:15]
    suffix = "" if res["counts"]["name"] == "full" else f"-{res['counts']['name']}"
    if partial and not suffix:
        suffix = "-only"  # full counts, not every phase: never taken for the last full run
    path = out_dir / f"{stamp}{suffix}.json"
    path.write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = markdown(res, rs)
    if results_md is not None:
        results_md.write_text(md + f"\nRaw results: `bench/results/{path.name}`.\n")
    return path, md
