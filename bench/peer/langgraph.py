"""The peer, side by side: LangGraph's in-memory dev server against coxswain, the same load.

``--peer langgraph`` installs ``langgraph-cli[inmem]`` and ``langgraph`` into their own venv
(``bench/.peer-venv``, never the project's), writes a project folder holding ``lg_graph.py``
(three 5 ms tool rounds, no LLM) and runs ``langgraph dev --no-browser --no-reload`` on
127.0.0.1, offline (tracing off; it phones nowhere we need). Both systems are driven by the
same lean HTTP client:

- queue: S threads/sessions x 5 runs/messages, ``multitask_strategy="enqueue"`` against our
  ``mode=queue``: runs/s, hand-off (previous end -> next start), queue wait, ordering kept.
- steer: a long run/turn going, then a new one with ``multitask_strategy="interrupt"`` against
  our ``mode=steer``: latency from the POST to the new run's/turn's start, old one stopped,
  nothing of the old one after the new one started.

LangGraph's times are its graph's own ``time.time()`` (first and last node) and its
checkpoints' ``created_at``; ours are the events' ``ts``. Same machine, same clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from cox.servers import free_port

from .. import session, verdict
from ..client import Pool, Watch
from ..profiles import Counts
from ..stack import CpuMeter, Servers, Stack
from ..stats import ratio, summary
from ..sweep import load

HERE = Path(__file__).resolve().parent
VENV = HERE.parent / ".peer-venv"
REQUIREMENTS = ["langgraph-cli[inmem]>=0.4", "langgraph>=1.0"]
DISTS = ("langgraph", "langgraph-cli", "langgraph-api", "langgraph-runtime-inmem", "langgraph-checkpoint")
MESSAGES = 5
LONG_ROUNDS = 400
TIMEOUT_S = 120.0


def ensure_venv(log: Any) -> Path:
    py = VENV / "bin" / "python"
    if not py.exists():
        log(f"  peer: creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
    probe = subprocess.run([str(py), "-c", "import langgraph_api, langgraph_runtime_inmem, langgraph.graph"],
                           capture_output=True, timeout=120, check=False)
    if probe.returncode != 0:
        log(f"  peer: installing {' '.join(REQUIREMENTS)} into {VENV}")
        subprocess.run([str(py), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True, timeout=1200)
    return VENV / "bin"


def versions(bin_dir: Path) -> dict[str, str]:
    code = f"import json, importlib.metadata as m; print(json.dumps({{d: m.version(d) for d in {DISTS!r}}}))"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(out.stdout))


class PeerServer:
    def __init__(self, tmp: Path, bin_dir: Path, jobs: int) -> None:
        self.dir = tmp / "langgraph-project"
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "lg_graph.py", self.dir / "lg_graph.py")
        (self.dir / "langgraph.json").write_text(json.dumps(
            {"dependencies": ["."], "graphs": {"bench": "./lg_graph.py:graph"}}))
        self.bin = bin_dir
        self.jobs = jobs
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "server.log"

    def spawn(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGSMITH", "LANGCHAIN", "OPENAI"))}
        env.update(LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false", PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                [str(self.bin / "langgraph"), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
                 "--port", str(self.port), "--n-jobs-per-worker", str(self.jobs), "--config", "langgraph.json"],
                cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    async def start(self) -> PeerServer:
        self.proc = self.spawn()
        pool = Pool(self.port, size=1, timeout=5)
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"langgraph dev exited:\n{self.log_path.read_text(errors='replace')[-3000:]}")
                try:
                    status, _ = await pool.get("/ok")
                    if status == 200:
                        return self
                except (OSError, TimeoutError, asyncio.IncompleteReadError):
                    pass
                await asyncio.sleep(0.25)
        finally:
            pool.close()
        raise RuntimeError("langgraph dev did not answer /ok within 120 s")

    def procs(self) -> dict[str, psutil.Process]:
        assert self.proc is not None
        p = psutil.Process(self.proc.pid)
        return {"langgraph": p, **{f"langgraph-child-{c.pid}": c for c in p.children(recursive=True)}}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def _post_ok(pool: Pool, path: str, body: Any) -> Any:
    status, res = await pool.post(path, body)
    if status not in (200, 201):
        raise RuntimeError(f"{path} answered {status}: {res!r}")
    return res


async def peer_queue(srv: PeerServer, n_threads: int) -> dict[str, Any]:
    pool = Pool(srv.port, size=32, timeout=TIMEOUT_S)
    try:
        threads = await session.gather_all([_post_ok(pool, "/threads", {}) for _ in range(n_threads)], TIMEOUT_S)
        tids = [t["thread_id"] for t in threads]
        sent: dict[str, list[dict[str, Any]]] = {t: [] for t in tids}
        sem = asyncio.Semaphore(64)

        async def feed(tid: str) -> None:
            for j in range(MESSAGES):
                async with sem:
                    run = await _post_ok(pool, f"/threads/{tid}/runs", {
                        "assistant_id": "bench", "input": {"marker": f"m{j}", "rounds": 0, "target": 3},
                        "multitask_strategy": "enqueue"})
                sent[tid].append(run)

        meter = CpuMeter(srv.procs()).start()
        t0w = time.time()
        await session.gather_all([feed(t) for t in tids], TIMEOUT_S)
        await session.gather_all([_join(pool, tid, sent[tid][-1]["run_id"]) for tid in tids], TIMEOUT_S * 3)
        meter.stop()
        states = await session.gather_all([_state(pool, tid) for tid in tids], TIMEOUT_S)
    finally:
        pool.close()
    ends, handoff, waits = [], [], []
    fifo = no_overlap = complete = True
    for tid, st in zip(tids, states, strict=True):
        log = st["values"].get("log", [])
        markers = [e["marker"] for e in log if e["ev"] == "start"]
        want = [f"m{j}" for j in range(MESSAGES)]
        if sorted(markers) != sorted(want):
            complete = False
        elif markers != want:
            fifo = False
        evs = [e["ev"] for e in log]
        if evs != ["start", "end"] * MESSAGES:
            no_overlap = False
        created = {f"m{j}": _ts(r["created_at"]) for j, r in enumerate(sent[tid])}
        last_end = None
        for e in log:
            if e["ev"] == "start":
                waits.append((e["t"] - created[e["marker"]]) * 1000)
                if last_end is not None:
                    handoff.append((e["t"] - last_end) * 1000)
            else:
                last_end = e["t"]
                ends.append(e["t"])
    runs = len(ends)
    span = max(ends) - t0w if ends else float("nan")
    ok = fifo and no_overlap and complete
    rps = runs / span if span > 0 else 0.0
    return {"threads": n_threads, "runs": runs, "runs_per_s": round(rps, 1), "runs_per_s_counted": round(rps, 1) if ok else 0.0,
            "handoff_end_to_start_ms": summary(handoff, 2), "queue_wait_ms": summary(waits, 1),
            "cpu_ms_per_run": round(meter.total / max(1, runs) * 1000, 2),
            "verdict": {"fifo": fifo, "no_overlap": no_overlap, "complete": complete, "ok": ok}}


async def _join(pool: Pool, tid: str, rid: str) -> None:
    status, res = await pool.get(f"/threads/{tid}/runs/{rid}/join")
    if status != 200:
        raise RuntimeError(f"join answered {status}: {res!r}")


async def _state(pool: Pool, tid: str) -> dict[str, Any]:
    status, res = await pool.get(f"/threads/{tid}/state")
    if status != 200:
        raise RuntimeError(f"state answered {status}: {res!r}")
    return dict(res)


async def peer_interrupt(srv: PeerServer, n: int) -> dict[str, Any]:
    pool = Pool(srv.port, size=4, timeout=TIMEOUT_S)
    lat, post_ms, problems = [], [], []
    try:
        for i in range(n):
            tid = (await _post_ok(pool, "/threads", {}))["thread_id"]
            old = await _post_ok(pool, f"/threads/{tid}/runs", {
                "assistant_id": "bench", "input": {"marker": "old", "rounds": 0, "target": LONG_ROUNDS}})
            await _wait_running(pool, tid, old["run_id"])
            t0w, t0 = time.time(), time.perf_counter()
            new = await _post_ok(pool, f"/threads/{tid}/runs", {
                "assistant_id": "bench", "input": {"marker": f"new{i}", "rounds": 0, "target": 3},
                "multitask_strategy": "interrupt"})
            post_ms.append((time.perf_counter() - t0) * 1000)
            await _join(pool, tid, new["run_id"])
            log = (await _state(pool, tid))["values"].get("log", [])
            start = next((e["t"] for e in log if e["marker"] == f"new{i}" and e["ev"] == "start"), None)
            if start is None:
                problems.append(f"{tid}: the new run never started")
                continue
            lat.append((start - t0w) * 1000)
            status, old_run = await pool.get(f"/threads/{tid}/runs/{old['run_id']}")
            if old_run.get("status") not in ("interrupted", "error"):
                problems.append(f"{tid}: the interrupted run ended {old_run.get('status')}")
            status, hist = await pool.post(f"/threads/{tid}/history", {"limit": 1000})
            if status != 200 or not isinstance(hist, list):
                raise RuntimeError(f"history answered {status}: {hist!r:.300}")
            late = [h for h in hist if (h.get("metadata") or {}).get("run_id") == old["run_id"]
                    and _ts(h["created_at"]) > start]
            if late:
                problems.append(f"{tid}: {len(late)} checkpoints of the interrupted run after the new one started")
    finally:
        pool.close()
    return {"n": len(lat), "post_to_new_run_start_ms": summary(lat, 2), "post_ms": summary(post_ms, 2),
            "no_overlap": not problems, "problems": problems[:5]}


async def _wait_running(pool: Pool, tid: str, rid: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        _, run = await pool.get(f"/threads/{tid}/runs/{rid}")
        if isinstance(run, dict) and run.get("status") == "running":
            await asyncio.sleep(0.05)  # well inside its tool rounds
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the long run never started")


def script_3x5() -> str:
    steps: list[dict[str, Any]] = [{"tools": [{"name": "list_dir", "args": {"path": "."}}]}]
    steps += [{"tools": [{"name": "list_dir", "args": {"path": f"d{k}"}}], "delay_ms": 5} for k in (1, 2)]
    steps.append({"text": "done", "delay_ms": 5})
    return session.script(steps, text="three tool rounds")


async def ours_steer(stack: Stack, pool: Pool, n: int) -> dict[str, Any]:
    s = (await session.create(pool, 1, "steer", title="steer"))[0]
    ws = Path(s["workspace"])
    for j in range(LONG_ROUNDS):
        (ws / f"d{j}").mkdir(exist_ok=True)
    long = session.script([{"tools": [{"name": "list_dir", "args": {"path": f"d{j}"}}], "delay_ms": 5}
                           for j in range(LONG_ROUNDS)], text="long")
    w = await Watch(stack.port, stack.token, s["id"]).start()
    lat, seen, post_ms = [], [], []
    try:
        for i in range(n):
            await w.idle(TIMEOUT_S)
            mark = len(w.events)
            res = await session.send(pool, w.sid, long)
            _, _, st = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=res["message_id"])
            await w.wait_type("tool.result", TIMEOUT_S, mark, turn_id=st["turn_id"])
            t0w, t0 = time.time(), time.perf_counter()
            new = await session.send(pool, w.sid, session.script([{"text": "steered"}], text=f"steer {i}"), mode="steer")
            post_ms.append((time.perf_counter() - t0) * 1000)
            _, t2, ns = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=new["message_id"])
            lat.append(ns["ts"] - t0w * 1000)
            seen.append((t2 - t0) * 1000)
            await w.idle(TIMEOUT_S)
    finally:
        await w.close()
    logs = await session.all_events(pool, [s["id"]])
    v = verdict.check(logs, {})
    stopped = sum(1 for e in logs[s["id"]] if e["type"] == "turn.end" and e.get("outcome") == "stopped")
    return {"n": n, "post_to_new_turn_start_ts_ms": summary(lat, 2), "post_to_new_turn_start_seen_ms": summary(seen, 2),
            "post_ms": summary(post_ms, 2), "no_overlap": v["no_overlap"], "stopped_turns": stopped}


async def run(tmp: Path, c: Counts, log: Any) -> dict[str, Any]:
    bin_dir = await asyncio.to_thread(ensure_venv, log)
    out: dict[str, Any] = {"versions": versions(bin_dir), "queue": [], "ours_queue": []}
    srv = await PeerServer(tmp, bin_dir, jobs=max(10, max(c.peer_threads))).start()
    try:
        for n in c.peer_threads:
            out["queue"].append(await peer_queue(srv, n))
            log(f"  peer langgraph S={n}: {out['queue'][-1]['runs_per_s']} runs/s")
        out["interrupt"] = await peer_interrupt(srv, c.peer_steer_n)
        log(f"  peer langgraph interrupt: p50 {out['interrupt']['post_to_new_run_start_ms'].get('p50')} ms")
        out["peer_jobs_per_worker"] = srv.jobs
        out["peer_log_tail"] = srv.log_path.read_text(errors="replace")[-600:]
    finally:
        srv.stop()
    servers = Servers(tmp / "peer-ours").start()
    stack = Stack(tmp / "peer-ours", servers, runners=2)
    try:
        stack.start()
        pool = Pool(stack.port, stack.token, size=32)
        try:
            for n in c.peer_threads:
                r = await load(stack, pool, n, MESSAGES, lambda j: script_3x5(), TIMEOUT_S * 3, workspace=f"peer{n}",
                               answer=lambda j: "done")
                out["ours_queue"].append(r)
                log(f"  peer ours S={n}: {r['turns_per_s']} turns/s")
            out["ours_steer"] = await ours_steer(stack, pool, c.peer_steer_n)
        finally:
            pool.close()
    finally:
        stack.stop()
        servers.stop()
    return out


def rows(p: dict[str, Any]) -> list[dict[str, Any]]:
    """coxswain (value) beside LangGraph (floor column), ratio = coxswain / LangGraph."""
    out = []

    def row(fig: str, ours: Any, peer: Any, unit: str, note: str = "") -> None:
        out.append({"section": "peer", "figure": fig, "value": ours, "floor": peer, "unit": unit,
                    "ratio": ratio(ours, peer), "note": note})

    for pq, oq in zip(p.get("queue", []), p.get("ours_queue", []), strict=False):
        n = pq["threads"]
        row(f"S={n} x {MESSAGES} runs/s (counted)", oq["turns_per_s_counted"], pq["runs_per_s_counted"], "runs/s",
            f"ordering: ours {oq['verdict']['ok']}, LangGraph {pq['verdict']['ok']}")
        row(f"S={n} hand-off p50 (end -> next start)", oq["handoff_end_to_first_output_ms"].get("p50"),
            pq["handoff_end_to_start_ms"].get("p50"), "ms",
            "ours: turn.end -> next turn's first model output; LangGraph: last node -> next run's first node")
        row(f"S={n} hand-off p99", oq["handoff_end_to_first_output_ms"].get("p99"),
            pq["handoff_end_to_start_ms"].get("p99"), "ms", "")
        row(f"S={n} queue wait p99", oq["queue_wait_ms"].get("p99"), pq["queue_wait_ms"].get("p99"), "ms",
            "ours: queue.added -> turn.start; LangGraph: run created_at -> first node")
        row(f"S={n} CPU per run", oq["cpu_ms_per_turn"], pq["cpu_ms_per_run"], "ms",
            "ours: every stack process incl. NATS and Redis; LangGraph: its one server process")
    if (pi := p.get("interrupt")) and (oi := p.get("ours_steer")):
        for q in ("p50", "p99"):
            row(f"steer vs interrupt: POST -> new run start {q}", oi["post_to_new_turn_start_ts_ms"].get(q),
                pi["post_to_new_run_start_ms"].get(q), "ms",
                f"no overlap: ours {oi['no_overlap']}, LangGraph {pi['no_overlap']}")
    return out
