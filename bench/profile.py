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
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    for mark in ("cox_runner", "cox_gateway", "cox_guard", "cox_judge", "cox_versions", "coxswain"):
        if f"/{mark}/" in file:
            return mark
    if "/lib/python3" in file:
        rest = file.split("/lib/python3", 1)[1].split("/", 2)
        return "stdlib:" + (rest[1].removesuffix(".py") if len(rest) > 1 else "?")
    return file.rsplit("/", 1)[-1] or "?"


def summarise(path: Path, top: int = 20) -> dict[str, Any]:
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
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
        names = []
        for raw in frames:
            fn, file = _frame(raw)
            names.append(f"{fn} ({file.rsplit('/', 1)[-1]})")
        self_t[names[-1]] += n
        pkgs[_package(_frame(frames[-1])[1])] += n
        for name in set(names):
            incl[name] += n

    def pct(c: Counter[str], k: int) -> list[list[Any]]:
        return [[name, round(100 * v / total, 1)] for name, v in c.most_common(k)] if total else []

    return {"samples": total, "self_pct": pct(self_t, top), "inclusive_pct": pct(incl, top + 10),
            "package_self_pct": pct(pkgs, 15)}


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
        return {"workload": result, "processes": per, "raw_dir": str(self.out_dir)}
