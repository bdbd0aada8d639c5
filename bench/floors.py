"""Floors, measured in the same run on the same servers, and the composite floors figures use.

Each floor program is its own process (``bench/floor/``). For every floor the result holds the
latency summary (ms), the probe's own CPU per operation and the CPU per operation of the
server-side processes (nats-server, redis-server, the responder, the ASGI app).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from cox.servers import free_port, wait_port
from coxswain.proc import dies_with_me

from .stack import CpuMeter, Servers

ROOT = Path(__file__).resolve().parent.parent


SEND_PACE_MS = 3.0
"""The pause before each request of ``send_chain_fastapi_paced``: the FastAPI chain floor made at
the send phase's pace, not back to back. There a POST goes ~3.3 ms after the last 202 (p50; the
phase records it as ``between_ms``), the session's turn run in between. On a VM a request after a
pause meets processes asleep and CPUs idle: every hop waits for its process to be woken (and on
one that packs woken tasks onto a busy vCPU, behind whatever runs there). A floor made back to
back never waits so (ANALYSIS.md)."""


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=dies_with_me())


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _probe(kind: str, n: int, warmup: int, procs: dict[str, psutil.Process], **kw: Any) -> dict[str, Any]:
    args = ["bench.floor.probe", kind, "--n", str(n), "--warmup", str(warmup)]
    for k, v in kw.items():
        args += [f"--{k}", str(v)]
    meter = CpuMeter(procs).start()
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, timeout=600, check=False)
    meter.stop()
    if out.returncode != 0:
        raise RuntimeError(f"floor probe {kind} failed:\n{out.stderr.decode(errors='replace')[-2000:]}")
    res: dict[str, Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    res["server_cpu_us_per_op"] = {k: round(v / (n + warmup) * 1e6, 1) for k, v in meter.spent.items()}
    return res


def measure(servers: Servers, n: int, warmup: int = 100, log: Any = print) -> dict[str, Any]:
    """Every floor, in turn, with nothing else running on the servers."""
    nats_url, redis_url = servers.nats.admin_url, servers.redis.admin_url
    sp = servers.procs()
    responder = _spawn(["bench.floor.responder", "--nats", nats_url, "--redis", redis_url])
    port = free_port()
    app = _spawn(["bench.floor.asgi_app", "--nats", nats_url, "--port", str(port)])
    fport = free_port()
    fapp = _spawn(["bench.floor.fastapi_app", "--nats", nats_url, "--port", str(fport)])
    out: dict[str, Any] = {}
    try:
        assert responder.stdout is not None
        line = responder.stdout.readline().decode()
        if "ready" not in line:
            raise RuntimeError(f"the floor responder did not start: {line}")
        wait_port(port, timeout=60)
        wait_port(fport, timeout=60)
        fp = {"nats-server": sp["nats-server"], "fastapi-app": psutil.Process(fapp.pid)}
        rp = {"nats-server": sp["nats-server"], "responder": psutil.Process(responder.pid)}
        ap = {"nats-server": sp["nats-server"], "asgi-app": psutil.Process(app.pid)}
        plan: list[tuple[str, dict[str, psutil.Process], dict[str, Any]]] = [
            ("nats_rr", rp, {"nats": nats_url}),
            ("js_publish", {"nats-server": sp["nats-server"]}, {"nats": nats_url}),
            ("redis_cas", {"redis-server": sp["redis-server"]}, {"redis": redis_url}),
            ("redis_cas_raw", {"redis-server": sp["redis-server"]}, {"redis": redis_url}),
            ("handoff_chain", {"nats-server": sp["nats-server"], "redis-server": sp["redis-server"]},
             {"nats": nats_url, "redis": redis_url}),
            ("http_post", ap, {"port": port}),
            ("http_post_httpx", ap, {"port": port}),
            ("send_chain", {**ap, **rp, "redis-server": sp["redis-server"]}, {"port": port}),
            ("send_chain_fastapi", {**fp, **rp, "redis-server": sp["redis-server"]}, {"port": fport}),
            ("send_chain_fastapi_paced", {**fp, **rp, "redis-server": sp["redis-server"]},
             {"port": fport, "pace-ms": SEND_PACE_MS}),
            ("python", {}, {}),
        ]
        for kind, procs, kw in plan:
            t0 = time.perf_counter()
            count = n if kind != "http_post_httpx" else max(200, n // 4)
            out[kind] = _probe(kind.removesuffix("_paced"), count, warmup, procs, **kw)
            log(f"  floor {kind}: p50 {out[kind]['ms']['p50']} ms, p99 {out[kind]['ms']['p99']} ms "
                f"({time.perf_counter() - t0:.1f}s)")
        out["rss_mb"] = {
            "responder": round(psutil.Process(responder.pid).memory_info().rss / 2**20, 1),
            "asgi-app": round(psutil.Process(app.pid).memory_info().rss / 2**20, 1),
        }
    finally:
        for p in (responder, app, fapp):
            with contextlib.suppress(Exception):
                _stop(p)
    return out


def stat(f: dict[str, Any], kind: str, q: str) -> float:
    return float(f[kind]["ms"][q])


def composite(f: dict[str, Any], q: str) -> dict[str, float]:
    """The floors of each figure, built from the measured parts (percentile ``q`` of each part).

    Summing p99s over-states a p99 floor (the parts rarely peak together), which makes the
    ratios at p99 kinder to us, not harsher.
    """
    http, rr, cas, js = (stat(f, k, q) for k in ("http_post", "nats_rr", "redis_cas", "js_publish"))
    return {
        # HTTP in, one NATS hop to a runner, one Redis script (admission + turn start are one script).
        "send": http + rr + cas,
        # ... and the event published to JetStream so a client can see it.
        "send_seen": http + rr + cas + js,
        # The bench's call is a read (list_dir): decided in the runner (coxswain.readpolicy), its
        # call, decision and result recorded by one Redis script and published once
        # (bench/README.md). A write's floor would add versions' request-reply.
        "tool_call": cas + js,
        # HTTP in, NATS hop, Redis script to save it, Redis script to apply it at the boundary.
        "lead": http + rr + 2 * cas,
        # From the boundary (the in-flight action recorded) to the Lead applied: the script that
        # takes the Leads, and its publish.
        "lead_boundary": cas + js,
        # Redis script that ends the turn and pops the next, the publish, one Redis script
        # recording the next turn's first output.
        "handoff": 2 * cas + js,
    }


def cpu_per_op(f: dict[str, Any], kind: str, with_client: bool = True) -> float:
    """CPU seconds one floor operation costs across its processes (servers, plus the probe)."""
    server = float(sum(f[kind]["server_cpu_us_per_op"].values()))
    return (server + (float(f[kind]["client_cpu_us"]) if with_client else 0.0)) / 1e6


def _admission_cpu(f: dict[str, Any]) -> float:
    """CPU seconds of a turn's own round: the HTTP request in, one NATS hop, three Redis scripts
    (its admission, its end and its trim)."""
    return cpu_per_op(f, "http_post", with_client=False) + cpu_per_op(f, "nats_rr") + 3 * cpu_per_op(f, "redis_cas")


def turn_cpu_floor(f: dict[str, Any]) -> Any:
    """CPU a turn needs at least, in ms, as a function of the events it records: its own round
    (:func:`_admission_cpu`) and one JetStream publish per event."""
    fixed = _admission_cpu(f)
    per_event = cpu_per_op(f, "js_publish")
    return lambda events: (fixed + events * per_event) * 1000


def run_cpu_floor(f: dict[str, Any], tool_calls: int) -> float:
    """CPU in ms that a run of ``tool_calls`` tool calls needs at least, whoever builds it: its own
    round (:func:`_admission_cpu`) and, for each call, what the tool-call figure's floor is (one
    Redis script that records it, one JetStream publish). Nothing for the model's own output, so
    it is lower than any run that records what the model said."""
    return (_admission_cpu(f) + tool_calls * (cpu_per_op(f, "redis_cas") + cpu_per_op(f, "js_publish"))) * 1000
