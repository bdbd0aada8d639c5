"""What every peer shares: its own venv, its server process, the load, the figures and the rows.

A peer is a :class:`Peer`: a server (a :class:`PeerServer` subclass: how to start it in its own
project folder) and a :class:`Driver` (how to create a session, post a run in ``queue`` or
``interrupt`` mode, wait for runs and read a session's run log) over the bench's lean HTTP
client. :func:`measure` drives the same two loads against any peer:

- warm-up: :data:`WARMUP_SESSIONS` sessions x :data:`MESSAGES` runs, not measured (ours too).
- queue: S sessions x :data:`MESSAGES` runs, each session's posted one after another (at most 64
  in flight over all), in rounds on fresh sessions until some 500 runs as our side
  (``sweep.rounds_for``): runs/s (counted only when ordering holds), hand-off (previous run's end
  -> next run's start), queue wait (enqueue -> start), CPU per run of the peer's server process.
- interrupt: a long run going, then a new run posted with ``interrupt``: POST -> the new run's
  start; the old one stopped and nothing of it recorded after the new one started.

A run log is a list of ``{"marker", "ev": "start" | "end", "t"}`` in the order the peer ran
them, ``t`` from the peer's own ``time.time()`` (same machine, same clock as the bench).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cox.servers import free_port

from .. import session
from ..client import Pool
from ..profiles import Counts
from ..stack import CpuMeter
from ..stats import ratio, summary
from ..sweep import rounds_for

MESSAGES = 5
LONG_ROUNDS = 400
TIMEOUT_S = 120.0
QUEUE_TARGET = 3
"""Tool rounds of a run: three 5 ms tool calls, as our script (``ours.script_3x5``)."""
IN_FLIGHT = 64
WARMUP_SESSIONS = 4
"""Sessions of the load run before the measured ones, not measured: each side is measured warm."""


def ensure_venv(venv: Path, requirements: list[str], probe: str, log: Any) -> Path:
    """The peer's own venv (never the project's), created and filled on first use; its bin folder."""
    py = venv / "bin" / "python"
    if not py.exists():
        log(f"  peer: creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    if subprocess.run([str(py), "-c", probe], capture_output=True, timeout=120, check=False).returncode != 0:
        log(f"  peer: installing {' '.join(requirements)} into {venv}")
        subprocess.run([str(py), "-m", "pip", "install", "-q", *requirements], check=True, timeout=1200)
    return venv / "bin"


def versions(bin_dir: Path, dists: tuple[str, ...]) -> dict[str, str]:
    code = f"import json, importlib.metadata as m; print(json.dumps({{d: m.version(d) for d in {dists!r}}}))"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(out.stdout))


class PeerServer:
    """The peer's server in its own project folder (``project``), on a free 127.0.0.1 port, in a
    session of its own; ready when ``GET ready_path`` answers 200."""

    project = "peer-project"
    ready_path = "/ok"
    env_drop: tuple[str, ...] = ()
    """Prefixes of the bench's environment variables the peer must not see (keys, tracing)."""

    def __init__(self, tmp: Path, bin_dir: Path, c: Counts) -> None:
        self.dir = tmp / self.project
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = bin_dir
        self.c = c
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "server.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(self.env_drop)} if self.env_drop \
            else dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def settings(self) -> dict[str, Any]:
        """How the peer was configured, for the report."""
        return {}

    def spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as out:
            return subprocess.Popen(self.argv(), cwd=self.dir, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    async def start(self) -> PeerServer:
        self.proc = self.spawn()
        pool = Pool(self.port, size=1, timeout=5)
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.argv()[0]} exited:\n{self.log_tail(3000)}")
                try:
                    status, _ = await pool.get(self.ready_path)
                    if status == 200:
                        return self
                except (OSError, TimeoutError, asyncio.IncompleteReadError):
                    pass
                await asyncio.sleep(0.25)
        finally:
            pool.close()
        self.stop()
        raise RuntimeError(f"the peer did not answer {self.ready_path} within 120 s:\n{self.log_tail(3000)}")

    def log_tail(self, n: int = 600) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def procs(self) -> dict[str, psutil.Process]:
        assert self.proc is not None
        p = psutil.Process(self.proc.pid)
        return {"server": p, **{f"child-{c.pid}": c for c in p.children(recursive=True)}}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(5)


async def post_ok(pool: Pool, path: str, body: Any) -> Any:
    status, res = await pool.post(path, body)
    if status not in (200, 201):
        raise RuntimeError(f"{path} answered {status}: {res!r:.300}")
    return res


async def get_ok(pool: Pool, path: str) -> Any:
    status, res = await pool.get(path)
    if status != 200:
        raise RuntimeError(f"{path} answered {status}: {res!r:.300}")
    return res


class Driver:
    """One peer's API over a pool. ``post`` returns the peer's handle of the run (a dict)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def session(self) -> str:
        raise NotImplementedError

    async def post(self, sid: str, marker: str, target: int, mode: str) -> dict[str, Any]:
        """``mode``: ``queue`` (behind the session's runs) or ``interrupt`` (stop the running one)."""
        raise NotImplementedError

    def created(self, run: dict[str, Any]) -> float:
        """When the peer took the run in (its enqueue time), seconds since the epoch."""
        raise NotImplementedError

    async def wait_running(self, sid: str, run: dict[str, Any]) -> None:
        raise NotImplementedError

    async def join(self, last: dict[str, dict[str, Any]]) -> None:
        """Until every session's last posted run (``last[sid]``) has ended."""
        raise NotImplementedError

    async def log(self, sid: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def interrupted(self, sid: str, old: dict[str, Any], new_start: float) -> list[str]:
        """What is wrong with the interrupted run: not stopped, or recorded after ``new_start``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Peer:
    name: str
    column: str
    """The peer's name in the report's column headers and notes."""
    label: str
    """What was run, for the table's title."""
    section: str
    """The rows' section: ``peer`` (LangGraph's, the name committed runs use) or ``peer <name>``."""
    venv: Path
    requirements: list[str]
    probe: str
    dists: tuple[str, ...]
    server: Callable[[Path, Path, Counts], PeerServer]
    driver: Callable[[Pool], Driver]
    handoff_note: str
    wait_note: str
    cpu_note: str


async def measure(peer: Peer, tmp: Path, c: Counts, log: Any) -> dict[str, Any]:
    """The queue load at each ``c.peer_threads`` and the interrupt load, on one server of the peer."""
    bin_dir = await asyncio.to_thread(ensure_venv, peer.venv, peer.requirements, peer.probe, log)
    out: dict[str, Any] = {"versions": versions(bin_dir, peer.dists), "queue": []}
    srv = await peer.server(tmp, bin_dir, c).start()
    try:
        # The first load is not measured: the server's first runs pay one-time costs, as ours do
        # (``sweep.warm_up``).
        for n, measured in [(WARMUP_SESSIONS, False), *((n, True) for n in c.peer_threads)]:
            drv = peer.driver(Pool(srv.port, size=32, timeout=TIMEOUT_S))
            try:
                r = await queue_load(drv, n, srv.procs(), rounds_for(n, MESSAGES) if measured else 1)
            finally:
                drv.pool.close()
            if measured:
                out["queue"].append(r)
                log(f"  peer {peer.name} S={n}: {r['runs_per_s']} runs/s")
        drv = peer.driver(Pool(srv.port, size=4, timeout=TIMEOUT_S))
        try:
            out["interrupt"] = await interrupt_load(drv, c.peer_steer_n)
        finally:
            drv.pool.close()
        log(f"  peer {peer.name} interrupt: p50 {out['interrupt']['post_to_new_run_start_ms'].get('p50')} ms")
        out["settings"] = srv.settings()
        out["peer_log_tail"] = srv.log_tail()
    finally:
        srv.stop()
    return out


async def queue_load(drv: Driver, n_sessions: int, procs: dict[str, psutil.Process], rounds: int = 1) -> dict[str, Any]:
    """``n_sessions`` sessions x :data:`MESSAGES` runs, ``rounds`` times on fresh sessions (as our
    side's :func:`bench.sweep.load`), the figures over all of them: CPU and span are each round's,
    summed, so the time between rounds counts for neither side."""
    sids = await session.gather_all([drv.session() for _ in range(n_sessions * rounds)], TIMEOUT_S)
    sent: dict[str, list[dict[str, Any]]] = {s: [] for s in sids}
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def feed(sid: str) -> None:
        for j in range(MESSAGES):
            async with sem:
                sent[sid].append(await drv.post(sid, f"m{j}", QUEUE_TARGET, "queue"))

    cpu_s = 0.0
    starts: list[tuple[list[str], float]] = []
    for r in range(rounds):
        group = sids[r * n_sessions:(r + 1) * n_sessions]
        meter = CpuMeter(procs).start()
        t0w = time.time()
        await session.gather_all([feed(s) for s in group], TIMEOUT_S)
        await asyncio.wait_for(drv.join({s: sent[s][-1] for s in group}), TIMEOUT_S * 3)
        meter.stop()
        cpu_s += meter.total
        starts.append((group, t0w))
    logs = await session.gather_all([drv.log(s) for s in sids], TIMEOUT_S)
    created = {s: {f"m{j}": drv.created(r) for j, r in enumerate(sent[s])} for s in sids}
    return {**queue_figures(dict(zip(sids, logs, strict=True)), created, starts, cpu_s), "rounds": rounds}


def queue_figures(logs: dict[str, list[dict[str, Any]]], created: dict[str, dict[str, float]],
                  starts: list[tuple[list[str], float]], cpu_s: float) -> dict[str, Any]:
    """The queue load's figures from each session's run log and its runs' enqueue times;
    ``starts`` is each round's sessions and the time its first post went out."""
    ends, handoff, waits = [], [], []
    fifo = no_overlap = complete = True
    want = [f"m{j}" for j in range(MESSAGES)]
    for sid, log in logs.items():
        markers = [e["marker"] for e in log if e["ev"] == "start"]
        if sorted(markers) != sorted(want):
            complete = False
        elif markers != want:
            fifo = False
        if [e["ev"] for e in log] != ["start", "end"] * MESSAGES:
            no_overlap = False
        last_end = None
        for e in log:
            if e["ev"] == "start":
                if e["marker"] in created[sid]:
                    waits.append((e["t"] - created[sid][e["marker"]]) * 1000)
                if last_end is not None:
                    handoff.append((e["t"] - last_end) * 1000)
            else:
                last_end = e["t"]
                ends.append(e["t"])
    runs = len(ends)
    span = 0.0
    for group, t0w in starts:
        last = [e["t"] for sid in group for e in logs.get(sid, []) if e["ev"] == "end"]
        span += max(last) - t0w if last else float("nan")
    ok = fifo and no_overlap and complete
    rps = runs / span if span > 0 else 0.0
    return {"threads": len(starts[0][0]) if starts else 0, "runs": runs,
            "runs_per_s": round(rps, 1), "runs_per_s_counted": round(rps, 1) if ok else 0.0,
            "handoff_end_to_start_ms": summary(handoff, 2), "queue_wait_ms": summary(waits, 1),
            "cpu_ms_per_run": round(cpu_s / max(1, runs) * 1000, 2),
            "verdict": {"fifo": fifo, "no_overlap": no_overlap, "complete": complete, "ok": ok}}


async def interrupt_load(drv: Driver, n: int) -> dict[str, Any]:
    lat, post_ms, problems = [], [], []
    for i in range(n):
        sid = await drv.session()
        old = await drv.post(sid, "old", LONG_ROUNDS, "queue")
        await drv.wait_running(sid, old)
        t0w, t0 = time.time(), time.perf_counter()
        new = await drv.post(sid, f"new{i}", QUEUE_TARGET, "interrupt")
        post_ms.append((time.perf_counter() - t0) * 1000)
        await asyncio.wait_for(drv.join({sid: new}), TIMEOUT_S)
        log = await drv.log(sid)
        start = next((e["t"] for e in log if e["marker"] == f"new{i}" and e["ev"] == "start"), None)
        if start is None:
            problems.append(f"{sid}: the new run never started")
            continue
        lat.append((start - t0w) * 1000)
        problems += await drv.interrupted(sid, old, start)
    return {"n": len(lat), "post_to_new_run_start_ms": summary(lat, 2), "post_ms": summary(post_ms, 2),
            "no_overlap": not problems, "problems": problems[:5]}


def rows(peer: Peer, p: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """coxswain (value) beside the peer (floor column), ratio = coxswain / peer."""
    out = []
    them = peer.column

    def row(fig: str, mine: Any, theirs: Any, unit: str, note: str = "") -> None:
        out.append({"section": peer.section, "figure": fig, "value": mine, "floor": theirs, "unit": unit,
                    "ratio": ratio(mine, theirs), "note": note})

    for pq, oq in zip(p.get("queue", []), ours.get("queue", []), strict=False):
        n = pq["threads"]
        row(f"S={n} x {MESSAGES} runs/s (counted)", oq["turns_per_s_counted"], pq["runs_per_s_counted"], "runs/s",
            f"ordering: ours {oq['verdict']['ok']}, {them} {pq['verdict']['ok']}")
        row(f"S={n} hand-off p50 (end -> next start)", oq["handoff_end_to_first_output_ms"].get("p50"),
            pq["handoff_end_to_start_ms"].get("p50"), "ms",
            f"ours: turn.end -> next turn's first model output; {them}: {peer.handoff_note}")
        row(f"S={n} hand-off p99", oq["handoff_end_to_first_output_ms"].get("p99"),
            pq["handoff_end_to_start_ms"].get("p99"), "ms", "")
        row(f"S={n} queue wait p99", oq["queue_wait_ms"].get("p99"), pq["queue_wait_ms"].get("p99"), "ms",
            f"ours: queue.added -> turn.start; {them}: {peer.wait_note}")
        row(f"S={n} CPU per run", oq["cpu_ms_per_turn"], pq["cpu_ms_per_run"], "ms",
            f"ours: every stack process incl. NATS and Redis, over {oq.get('turns')} turns; {them}: "
            f"{peer.cpu_note}, over {pq.get('runs')} runs")
    if (pi := p.get("interrupt")) and (oi := ours.get("steer")):
        for q in ("p50", "p99"):
            row(f"steer vs interrupt: POST -> new run start {q}", oi["post_to_new_turn_start_ts_ms"].get(q),
                pi["post_to_new_run_start_ms"].get(q), "ms",
                f"no overlap: ours {oi['no_overlap']}, {them} {pi['no_overlap']}")
    return out
