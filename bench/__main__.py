"""``./dev bench [--quick] [--peer langgraph,dbos] [--only PHASES] [--no-profile] [--cluster]``

Phases, in order: floors, send, tool_calls (+ py-spy profile), lead, handoff, chat, trace (wire
timelines; one stack, two runners, the floors' servers), sweep (a fresh stack per runner count), runs, memory (a fresh
stack), sandbox, compose (runners added with ``docker compose up --scale``, where Docker answers), peer (only with
``--peer``: each peer named, then our side once). A phase that fails is recorded and the rest go on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import uvloop

from . import (
    chat,
    compare,
    compose,
    floors,
    latency,
    memory,
    report,
    runs,
    sandbox,
    startup,
    sweep,
    toolcalls,
    traces,
)
from .client import Pool
from .peer import PEERS, base, ours, peer_rows
from .profile import Profiler
from .profiles import FULL, QUICK, Counts
from .stack import Servers, Stack
from .stats import merge_repeats

HERE = Path(__file__).resolve().parent
PHASES = ("floors", "send", "tool_calls", "lead", "handoff", "chat", "trace", "sweep", "runs", "memory", "sandbox", "compose",
          "peer")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - a missing tool is reported as such
        return f"unknown ({exc!r})"


QUIET_WAIT_S = 180.0
"""How long a run waits at most for the machine to be quiet before it starts (``--quiet-wait``)."""


def wait_quiet(cores: int, limit_s: float, read: Callable[[], tuple[float, float, float]] = os.getloadavg,
               sleep: Callable[[float], None] = time.sleep, step_s: float = 5.0) -> float:
    """Wait (up to ``limit_s``) until the 1-minute load average is at most half the cores: the
    mark a run is flagged "loaded" by. The average decays over a minute, so a run started right
    after tests or a build was flagged though it ran alone. Returns the seconds waited."""
    waited = 0.0
    while (load := read()[0]) > cores * 0.5 and waited < limit_s:
        if waited == 0:
            log(f"load average {load:.2f} on {cores} cores: waiting up to {limit_s:g} s for it to fall "
                f"to {cores * 0.5:g} (--quiet-wait 0 starts at once)")
        pause = min(step_s, limit_s - waited)
        sleep(pause)
        waited += pause
    return waited


def meta(argv: list[str]) -> dict[str, Any]:
    from cox.servers import nats_binary, redis_binary

    cpu, cpu_id = "unknown", ""
    try:
        info: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model", "stepping") and key.strip() not in info:
                info[key.strip()] = value.strip()
            elif not line.strip() and info:
                break  # the first processor's block
        cpu = info.get("model name", cpu)
        if "cpu family" in info and "model" in info:
            # A VM's model name can stay "AMD EPYC" across CPU generations: family and model tell.
            cpu_id = f"family {info['cpu family']} model {info['model']}"
    except OSError:
        pass
    libs = {}
    for d in ("nats-py", "redis", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic",
              "pydantic-ai-slim", "psutil", "py-spy"):
        try:
            libs[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            libs[d] = "absent"
    commit = _version(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"])
    dirty = _version(["git", "-C", str(HERE.parent), "status", "--porcelain", "--untracked-files=no"])
    if dirty and not dirty.startswith("unknown") and not commit.startswith("unknown"):
        commit += " (+ uncommitted changes)"
    load = os.getloadavg()
    cores = os.cpu_count() or 1
    import psutil

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node(), "cpu": cpu, "cpu_id": cpu_id, "cores": cores,
        "mem_gb": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
        "nats_server": _version([nats_binary(), "--version"]), "redis_server": _version([redis_binary(), "--version"]),
        "libraries": libs, "commit": commit, "command": "./dev bench " + " ".join(shlex.quote(a) for a in argv),
        "loadavg_start": [round(x, 2) for x in load], "loaded": load[0] > cores * 0.5,
    }


class Run:
    def __init__(self, counts: Counts, only: set[str], profile: bool, peers: list[str], tmp: Path,
                 cluster: bool = False) -> None:
        self.c = counts
        self.cluster = cluster
        self.only = only
        self.profile = profile
        self.peers = peers
        self.tmp = tmp
        self.res: dict[str, Any] = {"phases": {}, "errors": {}, "notes": []}

    def want(self, phase: str) -> bool:
        return phase in self.only

    async def phase(self, name: str, coro: Any) -> Any:
        t0 = time.perf_counter()
        log(f"phase {name} ...")
        try:
            out = await coro
        except Exception:  # noqa: BLE001 - recorded; the other phases still run
            self.res["errors"][name] = traceback.format_exc()
            log(f"phase {name} FAILED:\n{self.res['errors'][name]}")
            return None
        log(f"phase {name} done in {time.perf_counter() - t0:.1f}s")
        return out

    async def main(self) -> None:
        c = self.c
        servers = Servers(self.tmp / "main").start()
        try:
            if self.want("floors"):
                self.res["floors"] = await self.phase("floors", asyncio.to_thread(floors.measure, servers, c.floor_n,
                                                                                  100, log))
            if self.only & {"send", "tool_calls", "lead", "handoff", "chat", "trace"}:
                await self.latencies(servers)
        finally:
            servers.stop()
        f = self.res.get("floors")
        if self.want("sweep"):
            floor_fn = floors.turn_cpu_floor(f) if f else (lambda events: float("nan"))
            self.res["phases"]["sweep"] = await self.phase("sweep", sweep.sweep(
                self.tmp, c.sweep_sessions, c.sweep_runners, c.sweep_messages, c.sweep_delay_ms, c.sweep_timeout_s,
                floor_fn, log, kinds=("single", "cluster") if self.cluster else ("single",)))
            if self.cluster:
                self.res["phases"]["sweep_cluster_vs_single"] = sweep.cluster_vs_single(
                    self.res["phases"]["sweep"] or [])
        if self.want("runs"):
            floor_fn = floors.turn_cpu_floor(f) if f else (lambda events: float("nan"))
            self.res["phases"]["runs"] = await self.phase("runs", runs.runs(
                self.tmp, c.runs_tasks, c.runs_runners, c.runs_delay_ms, c.runs_interactive_n, c.runs_timeout_s,
                floor_fn, log))
        if self.want("memory"):
            self.res["phases"]["memory"] = await self.phase("memory", self.memory())
        if self.want("sandbox"):
            self.res["phases"]["sandbox"] = await self.phase("sandbox", sandbox.per_command(c.sandbox_n))
        if self.want("compose"):
            self.res["phases"]["compose"] = await self.phase("compose", compose.measure(self.tmp, c.compose_adds, log))
        if self.peers and self.want("peer"):
            await self.peer_phase()

    async def peer_phase(self) -> None:
        """Each peer on a server of its own (a phase each, so one that fails leaves the others),
        then our side once; every peer's rows set beside it."""
        res: dict[str, Any] = {}
        self.res["phases"]["peer"] = res
        for name in self.peers:
            res[name] = await self.phase(f"peer {name}", base.measure(PEERS[name], self.tmp, self.c, log))
        res["ours"] = await self.phase("peer ours", ours.measure(self.tmp, self.c, log))
        self.res["peer_rows"] = peer_rows(res)

    async def latencies(self, servers: Servers) -> None:
        c, ph = self.c, self.res["phases"]
        stack = Stack(self.tmp / "main", servers, runners=2).start()
        pool = Pool(stack.port, stack.token, size=8)
        runs: dict[str, list[Any]] = {}
        repeats = max(1, c.latency_repeats)
        try:
            for i in range(repeats):
                # Interleaved: a slow minute of the host lands in one repeat of each phase, and the
                # median of the repeats (stats.merge_repeats) leaves it out.
                of = f" ({i + 1}/{repeats})" if repeats > 1 else ""
                if self.want("send"):
                    runs.setdefault("send", []).append(await self.phase(
                        "send" + of, latency.send_to_start(stack, pool, c.send_n, c.send_sessions)))
                if self.want("tool_calls"):
                    runs.setdefault("tool_calls", []).append(await self.phase(
                        "tool_calls" + of, toolcalls.per_call(stack, pool, c.tool_calls, c.tool_turns,
                                                              self._profiled(stack) if i == 0 else None)))
                    if i == 0:
                        self._keep_profile()
                if self.want("lead"):
                    runs.setdefault("lead", []).append(await self.phase(
                        "lead" + of, latency.lead_applied(stack, pool, c.lead_n)))
                    runs.setdefault("lead_model", []).append(await self.phase(
                        "lead, a model of 20 ms" + of, latency.lead_applied(
                            stack, pool, max(20, c.lead_n // 5), delay_ms=latency.LEAD_MODEL_MS)))
                if self.want("handoff"):
                    runs.setdefault("handoff", []).append(await self.phase(
                        "handoff" + of, latency.handoff(stack, pool, c.handoff_rounds)))
            for name, got in runs.items():
                if merged := merge_repeats(got):  # a repeat that failed (None) is in errors, left out
                    ph[name] = merged
            if self.want("chat"):
                ph["chat"] = await self.phase("chat", chat.turn_cost(stack, pool, c.chat_sessions, c.chat_turns,
                                                                     c.chat_window))
            if self.want("trace"):
                self.res["traces"] = await self.phase("trace", traces.record(stack, pool))
        finally:
            pool.close()
            stack.stop()

    def _profiled(self, stack: Stack) -> Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None:
        """The tool-call phase's profiler (py-spy on the runners, guard and gateway), or None."""
        if not self.profile:
            return None
        procs = {k: v for k, v in stack.procs().items() if k.startswith(("turn-runner", "guard", "gateway"))}

        async def during(work: Callable[[], Awaitable[Any]]) -> Any:
            prof = await Profiler(procs, self.tmp / "profile").run(work)
            self.res["profile"] = prof
            return prof.get("workload")

        return during

    def _keep_profile(self) -> None:
        prof = self.res.get("profile")
        if not prof or "raw_dir" not in prof:
            return
        dest = HERE / "results" / f"profile-{self.c.name}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(prof["raw_dir"], dest)
        prof["raw_dir"] = str(dest.relative_to(HERE.parent))

    async def memory(self) -> Any:
        servers = Servers(self.tmp / "memory").start()
        stack = Stack(self.tmp / "memory", servers, runners=2)
        try:
            stack.start()
            pool = Pool(stack.port, stack.token, size=32)
            try:
                out = await memory.measure(stack, pool, self.c.memory_sessions, log)
                out["up_ready_s"] = stack.ready_s
                out["runner_start"] = await startup.runner_start(stack, self.c.runner_starts)
                log(f"  runner start -> serving: fresh {out['runner_start']['fresh_s'].get('p50')} s, "
                    f"fork {out['runner_start']['fork_s'].get('p50')} s")
                return out
            finally:
                pool.close()
        finally:
            stack.stop()
            servers.stop()


def override(counts: Counts, pairs: list[str]) -> Counts:
    """``NAME=VALUE`` pairs applied to ``counts`` (tuples as comma lists); the name marks the run."""
    if not pairs:
        return counts
    changes: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in Counts.__dataclass_fields__ or name == "name":
            raise ValueError(f"--set {pair!r}: expected NAME=VALUE with NAME among the fields of bench/profiles.py")
        current = getattr(counts, name)
        if isinstance(current, tuple):
            changes[name] = tuple(int(x) for x in value.split(",") if x)
        else:
            changes[name] = type(current)(value)
    return replace(counts, name=f"{counts.name}-custom", **changes)


def main() -> int:
    p = argparse.ArgumentParser(prog="./dev bench", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="small counts, under 3 minutes (for development)")
    p.add_argument("--peer", action="append", default=[], metavar="NAME[,NAME]",
                   help=f"also run peers side by side, each installed apart: {', '.join(PEERS)} "
                        "(a comma list, or the flag repeated)")
    p.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases among {','.join(PHASES)}")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of the tool-call turn")
    p.add_argument("--cluster", action="store_true",
                   help="run the sweep on single servers and on clusters (3-node NATS) in the same run, "
                        "and report turns/s and CPU per turn of each with the ratio")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs of every process)")
    p.add_argument("--note", action="append", default=[], help="a note to print in RESULTS.md (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a count of bench/profiles.py, e.g. --set sweep_sessions=100,300 (repeatable)")
    p.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S, metavar="S",
                   help="wait up to S seconds for the load average to fall to half the cores before "
                        "starting (default %(default)g; 0: start at once)")
    p.add_argument("--compare", nargs="?", const="", metavar="FILE",
                   help="set every ratio beside those of FILE (default: the last committed full run) and "
                        "list each that grew by more than 20%%")
    a = p.parse_args()
    against: tuple[str, dict[str, Any]] | None = None
    if a.compare is not None:
        target = Path(a.compare) if a.compare else compare.last_committed()
        if target is None:
            p.error("--compare: no committed full run in bench/results/ to compare with")
        try:
            against = (target.name, compare.load(target))
        except ValueError as exc:
            p.error(str(exc))
    peers = list(dict.fromkeys(x.strip() for v in a.peer for x in v.split(",") if x.strip()))
    if unknown_peers := [x for x in peers if x not in PEERS]:
        p.error(f"unknown peers: {', '.join(unknown_peers)} (known: {', '.join(PEERS)})")
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    unknown = only - set(PHASES)
    if unknown:
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    counts = QUICK if a.quick else FULL
    try:
        counts = override(counts, a.set)
    except ValueError as exc:
        p.error(str(exc))
    waited = wait_quiet(os.cpu_count() or 1, max(0.0, a.quiet_wait))
    tmp = Path(tempfile.mkdtemp(prefix="cox-bench-"))
    run = Run(counts, only, not a.no_profile, peers, tmp, a.cluster)
    run.res["meta"] = meta(sys.argv[1:])
    run.res["meta"]["quiet_wait_s"] = round(waited, 1)
    run.res["counts"] = asdict(counts)
    run.res["notes"] += a.note
    log(f"bench ({counts.name}) in {tmp}; load average {run.res['meta']['loadavg_start']}")
    try:
        uvloop.run(run.main())
    finally:
        run.res["elapsed_s"] = round(time.perf_counter() - T0, 1)
        run.res["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        full = counts.name == "full" and only == set(PHASES)
        path, md = report.write(run.res, HERE / "results", HERE / "RESULTS.md" if full else None,
                                partial=not full)
        if against is not None:
            run.res["comparison"] = cmp = compare.compare(run.res["rows"], against[1], against[0], run.res)
            path.write_text(json.dumps(run.res, indent=1, default=str) + "\n")
            md += "\n" + "\n".join(compare.markdown(cmp))
        print(md)
        log(f"results: {path}" + ("; table in bench/RESULTS.md" if full else ""))
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    return 1 if run.res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
