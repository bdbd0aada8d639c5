"""Where the time goes: py-spy attached to running services while a workload runs.

``Profiler`` starts ``py-spy record --format raw`` (collapsed stacks, non-blocking, idle frames
left out, so samples are roughly CPU time) on each process, runs the workload, stops py-spy with
SIGINT and summarises: samples per process, the top frames by self and by inclusive time, and
self time per package (pydantic_ai, nats, redis, json, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

NATIVE_LOOP = frozenset({"run (runners.py)", "Runner.run (runners.py)", "run_until_complete (base_events.py)"})
"""With uvloop the loop runs in C: samples whose innermost Python frame is the runner's are the
loop's own native work (polling, socket reads and writes, callbacks' C side)."""
FRAME_RE = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def _frame(raw: str) -> tuple[str, str]:
    m = FRAME_RE.match(raw.strip())
    if not m:
        return raw.strip(), ""
    return m["fn"], m["file"]


def _package(file: str) -> str:
    """py-spy names files relative to their sys.path entry: ``cox_runner/loop.py``,
    ``redis/asyncio/connection.py``, ``asyncio/runners.py``; the first part is the package."""
    if "site-packages/" in file:
        file = file.split("site-packages/", 1)[1]
    if file.startswith("<"):
        return file
    head = file.split("/", 1)[0]
    return head.removesuffix(".py") if "/" in file else "module " + head


def summarise(path: Path, top: int = 20) -> dict[str, Any]:
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    pkgs: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"samples": 0}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        names, mine = [], []
        for raw in frames:
            fn, file = _frame(raw)
            names.append(f"{fn} ({file.rsplit('/', 1)[-1]})")
            if _package(file).startswith(("cox_", "coxswain")):
                mine.append(f"{_package(file)}.{fn}")
        leaf_pkg = _package(_frame(frames[-1])[1])
        if names[-1] in NATIVE_LOOP:
            names[-1] = leaf_pkg = "event loop (uvloop, native code)"
        self_t[names[-1]] += n
        pkgs[leaf_pkg] += n
        for name in set(names):
            incl[name] += n
        for name in set(mine):
            ours[name] += n

    def pct(c: Counter[str], k: int, below: float = 101.0) -> list[list[Any]]:
        rows = [(name, round(100 * v / total, 1)) for name, v in c.most_common()] if total else []
        return [[name, p] for name, p in rows if p < below][:k]

    return {"samples": total, "self_pct": pct(self_t, top), "inclusive_pct": pct(incl, top + 10),
            "ours_inclusive_pct": pct(ours, top, below=75.0), "package_self_pct": pct(pkgs, 15)}


class Profiler:
    def __init__(self, procs: dict[str, psutil.Process], out_dir: Path, rate: int = 250) -> None:
        self.procs = procs
        self.out_dir = out_dir
        self.rate = rate
        self.spies: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, exe: str) -> None:
        for name, p in self.procs.items():
            self.spies[name] = subprocess.Popen(
                [exe, "record", "--pid", str(p.pid), "--rate", str(self.rate), "--format", "raw", "--nonblocking",
                 "-o", str(self.out_dir / f"{name}.txt")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    async def run(self, work: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        exe = py_spy()
        if exe is None:
            return {"error": "py-spy is not installed (pip install py-spy)"}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(exe)
        await asyncio.sleep(2.0)  # py-spy attaches within a few hundred ms; it prints no ready line
        try:
            result = await work()
        finally:
            logs = {}
            for spy in self.spies.values():
                with contextlib.suppress(ProcessLookupError):
                    spy.send_signal(signal.SIGINT)
            for name, spy in self.spies.items():
                try:
                    out, _ = await asyncio.to_thread(spy.communicate, timeout=30)
                    logs[name] = out.decode(errors="replace")[-300:]
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait(5)
        per = {name: summarise(self.out_dir / f"{name}.txt") for name in self.procs}
        for name, s in per.items():
            if not s.get("samples"):
                s["py_spy_said"] = logs.get(name, "")
        return {"workload": result, "processes": per, "raw_dir": str(self.out_dir), "rate": self.rate}
